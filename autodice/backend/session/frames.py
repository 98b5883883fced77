"""Where a stream's frames come from: a batch in one ``.npy``, a folder of images, raw stdin.

Each source yields ``(label, frame)`` pairs lazily (a folder of 100,000 images is never held in
memory); a frame that cannot be made (an unreadable image) is yielded as a
:class:`~autodice.backend.session.gateway.FrameError` in its place, so the session reports it
and goes on.

Images are made into a model input by a stated recipe (:class:`ImageRecipe`), by default the one
torchvision's ImageNet models were trained with: shorter side resized to 256/224 of the input's
size, centre crop to the input, RGB scaled to [0, 1], normalised by ImageNet's mean and std, NCHW.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ...core.errors import AutodiceError
from .gateway import FrameError

MAX_PIXELS = 100 * 10**6  # decoded at most: a 100-megapixel RGB image is 300 MB
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm")


# What --preprocess takes (sizes of mean and std): resize 1 crops the whole shorter side; past
# 16 a frame is a 16th of the image's middle. A std below 1e-6 turns pixels into numbers past
# any model's range.
_RANGES = {"resize": (1.0, 16.0), "scale": (1e-6, 1e9), "mean": (0.0, 1e6), "std": (1e-6, 1e6)}


@dataclass(frozen=True)
class ImageRecipe:
    """How an image becomes a frame; every field can be overridden (``--preprocess``)."""

    resize: float = 256 / 224  # shorter side -> this times the crop's shorter side
    mean: tuple[float, ...] = (0.485, 0.456, 0.406)
    std: tuple[float, ...] = (0.229, 0.224, 0.225)
    scale: float = 255.0  # pixel values are divided by this first
    layout: str = "nchw"  # or "nhwc"
    bgr: bool = False  # channel order (Caffe-era models want BGR)

    @classmethod
    def parse(cls, text: str | None) -> ImageRecipe:
        """``resize=1.0,mean=0.5/0.5/0.5,std=0.5/0.5/0.5,scale=255,layout=nhwc,bgr=1``.

        Raises:
            AutodiceError: an unknown key, a value that is not a number, or one no image can
                take (a std or scale of 0, two means for three channels), before any frame.
        """
        recipe = cls()
        for item in filter(None, (text or "").split(",")):
            key, _, value = item.partition("=")
            key, value = key.strip(), value.strip()
            try:
                if key in ("mean", "std"):
                    values = tuple(float(v) for v in value.split("/"))
                    low, high = _RANGES[key]
                    if not all(low <= abs(v) <= high for v in values) or len(values) > 4:
                        raise AutodiceError(f"--preprocess {item}: one to four numbers, each "
                                            f"of size {low:g} to {high:g}")
                    recipe = replace(recipe, **{key: values})
                elif key in ("resize", "scale"):
                    number = float(value)
                    low, high = _RANGES[key]
                    if not low <= number <= high:
                        raise AutodiceError(f"--preprocess {item}: a number from {low:g} to "
                                            f"{high:g}")
                    recipe = replace(recipe, **{key: number})
                elif key == "layout" and value.lower() in ("nchw", "nhwc"):
                    recipe = replace(recipe, layout=value.lower())
                elif key == "bgr" and value.lower() in ("0", "1", "false", "true", "no", "yes"):
                    recipe = replace(recipe, bgr=value.lower() in ("1", "true", "yes"))
                else:
                    raise AutodiceError(f"--preprocess {item}: keys are resize, mean, std, scale, "
                                        "layout (nchw or nhwc), bgr (0 or 1)")
            except ValueError:
                raise AutodiceError(f"--preprocess {item}: not a number") from None
        return recipe

    def apply(self, path, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """The image at ``path`` (or a PIL image, or a decoded video frame) as a frame of
        ``shape`` (N=1, C=3, H, W in ``layout``).

        Raises:
            ValueError: the image cannot be read or the shape is not an image's.
        """
        from PIL import Image

        if len(shape) != 4 or shape[0] != 1:
            raise ValueError(f"the input is {'x'.join(map(str, shape))}, not one image")
        h, w = (shape[2], shape[3]) if self.layout == "nchw" else (shape[1], shape[2])
        channels = shape[1] if self.layout == "nchw" else shape[3]
        mode = {1: "L", 3: "RGB", 4: "RGBA"}.get(channels)
        if mode is None:
            raise ValueError(f"the input has {channels} channels: an image gives 1 (grey), "
                             "3 (RGB) or 4 (RGBA)")
        from .video import is_frame

        if is_frame(path):  # scaled as it is converted
            return self._video(path, h, w, channels, dtype)
        given = isinstance(path, Image.Image)  # the caller's: used, not closed
        with warnings.catch_warnings():  # Pillow's own bomb check: ours below, one message
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            try:
                img = path if given else Image.open(path)
            except Image.DecompressionBombError:
                img = None
        if img is None or img.width * img.height > MAX_PIXELS:  # from the header: not decoded
            size = f"{img.width}x{img.height} pixels" if img else "more pixels"
            raise ValueError(f"{size}, past the {MAX_PIXELS // 10**6} million autodice decodes")
        with nullcontext(img) if given else img:
            img = img.convert(mode)
            # torchvision's recipe (shorter side scaled, then the centre cropped), computed as
            # one resample of the crop's region of the source: the same filter at the same
            # places (measured: at most one level of 255 apart, in under 0.5 % of pixels, from
            # rounding), and memory bounded by the frame whatever the image's shape (a 60000x1
            # image scaled whole asked for 15,360,000x256 pixels).
            k = self.resize * min(h, w) / min(img.size)
            big_w, big_h = max(w, round(img.size[0] * k)), max(h, round(img.size[1] * k))
            left, top = (big_w - w) // 2, (big_h - h) // 2
            kx, ky = big_w / img.size[0], big_h / img.size[1]
            img = img.resize((w, h), Image.BILINEAR,
                             box=(left / kx, top / ky, (left + w) / kx, (top + h) / ky))
            a = np.asarray(img, dtype=np.float32)
        return self.normalised(a.reshape(h, w, channels), dtype)

    def _video(self, frame, h: int, w: int, channels: int, dtype: np.dtype) -> np.ndarray:
        """A decoded video frame by the recipe: scaled whole by FFmpeg (:func:`~.video.scaled`)
        to where its centre crop is the frame, then cropped."""
        from .video import scaled

        k = self.resize * min(h, w) / min(frame.width, frame.height)
        big_w, big_h = max(w, round(frame.width * k)), max(h, round(frame.height * k))
        left, top = (big_w - w) // 2, (big_h - h) // 2
        pixels = scaled(frame, big_w, big_h, {1: "gray", 3: "rgb24", 4: "rgba"}[channels])
        crop = pixels.reshape(big_h, big_w, channels)[top:top + h, left:left + w]
        return self.normalised(crop.astype(np.float32), dtype)

    def normalised(self, a: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """Pixels ``a`` (H, W, C as decoded) as a frame: scaled, channels reordered, mean and
        std applied, laid out as ``layout`` with a batch axis of 1."""
        channels = a.shape[2]
        a = a / self.scale
        if self.bgr and channels > 1:  # BGR, BGRA
            a = a[..., [2, 1, 0, 3][:channels]]
        a = (a - np.array(self.mean[:channels], np.float32)) / np.array(self.std[:channels],
                                                                        np.float32)
        if self.layout == "nchw":
            a = a.transpose(2, 0, 1)
        return np.ascontiguousarray(a[None]).astype(dtype)


def frames_from(source: str, shape: tuple[int, ...], dtype: np.dtype,
                recipe: ImageRecipe | None = None,
                letterboxed: bool = False) -> tuple[int | None, Iterator]:
    """(number of frames if known, the ``(label, frame)`` pairs) of ``source``: a ``.npy``
    holding a batch ``(N, ...)`` of frames (or one frame), a folder of images, one image, a
    video (a file, a stream URL, a camera: :mod:`.video`), or ``-`` for frames of ``shape`` and
    ``dtype`` as raw bytes on stdin, one after another. ``recipe`` (``--preprocess``) is for
    images: with any other source it is an error, not a recipe silently left unused.
    ``letterboxed``: images and video frames are letterboxed instead (``--task detect`` and
    ``segment``: the whole picture scaled to fit, padded), normalised by ``recipe`` (its resize
    aside) or, without one, as Ultralytics does, and each is ``(label, frame, Letterbox, the
    picture)``.

    Raises:
        AutodiceError: a source that does not exist, a ``.npy`` of no use for this input, a
            folder without images, a video that cannot be opened, or a recipe for a source of
            no images; all before any frame is read.
    """
    from .video import is_video, video_frames

    path = Path(source)
    if letterboxed and not holds_pictures(source):
        raise AutodiceError(f"--task: {'stdin' if source == '-' else path} holds no images or "
                            "video; its frames are fed as they are, so no result can be mapped "
                            "back to a picture")
    if letterboxed and (len(shape) != 4 or tuple(shape[:2]) != (1, 3)):
        raise AutodiceError("--task: frames are letterboxed into a 1x3xHxW input; this one is "
                            f"{'x'.join(map(str, shape))}")
    if is_video(source):
        return video_frames(source, _maker(shape, dtype, recipe, letterboxed))
    if source == "-" or not (path.is_dir() or is_image(path)):  # frames as they are
        if recipe is not None:
            raise AutodiceError(f"--preprocess: {'stdin' if source == '-' else path} holds no "
                                "images, its frames are fed as they are")
        if source == "-":
            return None, _stdin_frames(shape, dtype)
        batch = _load_batch(path, shape, dtype)
        return len(batch), ((str(i), batch[i]) for i in range(len(batch)))
    if path.is_dir():
        images = sorted(p for p in path.iterdir() if is_image(p))
        if not images:
            raise AutodiceError(f"{path}: no images there ({', '.join(IMAGE_SUFFIXES)})")
    elif path.is_file():
        images = [path]
    else:
        raise AutodiceError(f"{path}: no such image")
    given = recipe or ImageRecipe()
    channels = (shape[1] if given.layout == "nchw" else shape[3]) if len(shape) == 4 else 0
    for key in ("mean", "std"):  # an input that is no image: each frame says so
        values = getattr(given, key)
        if channels and len(values) not in (1, channels):
            raise AutodiceError(f"--preprocess {key}={'/'.join(f'{v:g}' for v in values)}: "
                                f"one value, or one per channel of the input ({channels})")
    return len(images), _image_frames(images, _maker(shape, dtype, recipe, letterboxed))


def holds_pictures(source: str | Path) -> bool:
    """Whether ``source`` is pictures (a folder of images, an image, a video), whose frames are
    made here, rather than frames as they are (a ``.npy``, stdin)."""
    from .video import is_video

    path = Path(source)
    return str(source) != "-" and (path.is_dir() or is_image(path) or is_video(str(source)))


def is_image(path: Path) -> bool:
    """Whether ``path`` names an image (by its suffix, as a folder's images are found)."""
    return path.suffix.lower() in IMAGE_SUFFIXES


def is_stream(source: str, shape: tuple[int, ...]) -> bool:
    """Whether ``source`` holds a stream of frames (one image is a stream of one) rather than
    the one frame ``run --frames`` repeats (a ``.npy`` that is neither is left to run's own
    checks, which name what is wrong)."""
    from .video import is_video

    if source == "-" or Path(source).is_dir() or is_image(Path(source)) or is_video(source):
        return True
    try:
        a = open_npy(source)
    except AutodiceError:
        return False
    shape = tuple(shape)
    return a.shape != shape and (a.shape[1:] == shape or (
        shape[:1] == (1,) and a.ndim == len(shape) and a.shape[1:] == shape[1:]))


def open_npy(path: str | Path) -> np.ndarray:
    """The array of a ``.npy`` file, mapped rather than read: a header may claim any shape
    (one of a few bytes claimed 596 GiB), and only what the file holds is ever touched.

    Raises:
        AutodiceError: ``PATH: ...`` for a file that cannot be read, is empty or no ``.npy``,
            holds Python objects, or is shorter than its header says.
    """
    try:
        with open(path, "rb") as f:
            if f.read(6) != b"\x93NUMPY":
                raise ValueError("no .npy header; write it with numpy.save")
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except OSError as e:
        raise AutodiceError(f"{path}: cannot read it ({e.strerror or e})") from None
    except EOFError:
        raise AutodiceError(f"{path}: not a .npy array (it ends inside its header)") from None
    except ValueError as e:
        why = ("shorter than its header says" if "mmap length" in str(e) else str(e))
        raise AutodiceError(f"{path}: not a .npy array ({why})") from None


def _load_batch(path: Path, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    a = open_npy(path)
    if a.dtype != np.dtype(dtype):  # every frame would fail alike: refused up front
        raise AutodiceError(f"{path}: its frames are {a.dtype}, the model input takes "
                            f"{np.dtype(dtype).name}")
    if a.shape == tuple(shape):
        return a[None]
    if a.shape[1:] == tuple(shape) or (shape[:1] == (1,) and a.shape[1:] == tuple(shape[1:])):
        if len(a) == 0:
            raise AutodiceError(f"{path}: a batch of no frames")
    if a.shape[1:] == tuple(shape):
        return a
    if shape[:1] == (1,) and a.shape[1:] == tuple(shape[1:]):  # frames stacked on the batch axis
        return a[:, None]
    raise AutodiceError(f"{path}: {'x'.join(map(str, a.shape))} is neither one frame nor a batch "
                        f"(N, ...) of frames of {'x'.join(map(str, shape))}")


def _maker(shape, dtype, recipe: ImageRecipe | None, letterboxed: bool):
    """What a picture (a path, a PIL image, a video frame) becomes after its label: ``(frame,)``, or
    ``(frame, Letterbox, picture)`` letterboxed (normalised by ``recipe`` when given)."""
    if letterboxed:  # the picture too: its results may be drawn on it (--annotate)
        from .detect import letterbox

        return lambda picture: (*letterbox(picture, shape, dtype, recipe), picture)
    recipe = recipe or ImageRecipe()
    return lambda picture: (recipe.apply(picture, shape, dtype),)


def _image_frames(images: list[Path], make) -> Iterator:
    for i, p in enumerate(images):
        try:
            yield (p.name, *make(p))
        except Exception as e:  # noqa: BLE001 - any decoder error is this image's problem
            yield p.name, _cannot(i, p, e)


def _cannot(index: int, image, e: Exception) -> FrameError:
    why = str(e).replace(f" '{image}'", "")  # Pillow names the file again
    return FrameError(index, f"{image}: cannot make a frame of it ({why})")


def image_frame(item, index: int, inputs, recipe: ImageRecipe):
    """``item`` of a session's stream as a frame: an image (a path, a PIL image, a decoded
    video frame) made into one by ``recipe`` for the model's one input, anything else as it is
    (an array, a dict).

    Raises:
        FrameError: the image cannot be read, or the model's input is no image's.
    """
    return _picture_frame(item, index, inputs, item,
                          lambda picture, t: recipe.apply(picture, t.shape, t.dtype))


def letterboxed(item, index: int, inputs, recipe: ImageRecipe | None = None):
    """``item`` of a detector's or segmenter's session's stream: a picture (a path, a PIL image,
    a decoded video frame) letterboxed for the model's one input (normalised by ``recipe``, else
    as Ultralytics does), with its :class:`~.detect.Letterbox`; anything else as it is (its
    result stays in the input's pixels).

    Raises:
        FrameError: the image cannot be read, or the model's input is no image's.
    """
    from .detect import letterbox

    return _picture_frame(item, index, inputs, (item, None),
                          lambda picture, t: letterbox(picture, t.shape, t.dtype, recipe))


def _picture_frame(item, index: int, inputs, otherwise, make):
    """``make(picture, the model's one input)`` for a picture, ``otherwise`` for anything else."""
    from PIL import Image

    from .video import is_frame

    video = is_frame(item)
    if not (video or isinstance(item, (str, os.PathLike, Image.Image))):
        return otherwise
    name = "the image" if video or isinstance(item, Image.Image) else item
    if len(inputs) != 1:
        raise FrameError(index, f"{name}: the model has inputs "
                                f"{', '.join(t.name for t in inputs)}: an image feeds one")
    try:
        return make(item, inputs[0])
    except Exception as e:  # noqa: BLE001 - any decoder error is this image's problem
        raise _cannot(index, name, e) from None


def _stdin_frames(shape, dtype) -> Iterator:
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    stream = sys.stdin.buffer
    i = 0
    while True:
        data = stream.read(size)
        if not data:
            return
        if len(data) < size:
            yield str(i), FrameError(i, f"stdin ended {len(data)} bytes into a frame of {size}")
            return
        yield str(i), np.frombuffer(data, dtype).reshape(shape)
        i += 1
