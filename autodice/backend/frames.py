"""Where a stream's frames come from: a batch in one ``.npy``, a folder of images, raw stdin.

Each source yields ``(label, frame)`` pairs lazily (a folder of 100,000 images is never held in
memory); a frame that cannot be made (an unreadable image) is yielded as a
:class:`~autodice.backend.gateway.FrameError` in its place, so the session reports it and goes on.

Images are made into a model input by a stated recipe (:class:`ImageRecipe`), by default the one
torchvision's ImageNet models were trained with: shorter side resized to 256/224 of the input's
size, centre crop to the input, RGB scaled to [0, 1], normalised by ImageNet's mean and std, NCHW.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..core.errors import AutodiceError
from .gateway import FrameError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm")


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
                    if not all(map(math.isfinite, values)) or (key == "std" and 0 in values):
                        raise AutodiceError(f"--preprocess {item}: finite numbers"
                                            + (", none of them 0" if key == "std" else ""))
                    recipe = replace(recipe, **{key: values})
                elif key in ("resize", "scale"):
                    number = float(value)
                    if not math.isfinite(number) or number <= 0:
                        raise AutodiceError(f"--preprocess {item}: a finite number above 0")
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

    def apply(self, path: Path, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """The image at ``path`` as a frame of ``shape`` (N=1, C=3, H, W in ``layout``).

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
        with Image.open(path) as img:
            img = img.convert(mode)
            short = min(img.size)
            k = self.resize * min(h, w) / short
            img = img.resize((max(w, round(img.size[0] * k)), max(h, round(img.size[1] * k))),
                             Image.BILINEAR)
            left, top = (img.size[0] - w) // 2, (img.size[1] - h) // 2
            a = np.asarray(img.crop((left, top, left + w, top + h)), dtype=np.float32)
        a = a.reshape(h, w, channels) / self.scale
        if self.bgr and channels > 1:  # BGR, BGRA
            a = a[..., [2, 1, 0, 3][:channels]]
        a = (a - np.array(self.mean[:channels], np.float32)) / np.array(self.std[:channels],
                                                                        np.float32)
        if self.layout == "nchw":
            a = a.transpose(2, 0, 1)
        return np.ascontiguousarray(a[None]).astype(dtype)


def frames_from(source: str, shape: tuple[int, ...], dtype: np.dtype,
                recipe: ImageRecipe | None = None) -> tuple[int | None, Iterator]:
    """(number of frames if known, the ``(label, frame)`` pairs) of ``source``: a ``.npy``
    holding a batch ``(N, ...)`` of frames (or one frame), a folder of images, one image, or
    ``-`` for frames of ``shape`` and ``dtype`` as raw bytes on stdin, one after another.
    ``recipe`` (``--preprocess``) is for images: with any other source it is an error, not a
    recipe silently left unused.

    Raises:
        AutodiceError: a source that does not exist, a ``.npy`` of no use for this input, a
            folder without images, or a recipe for a source of no images; all before any frame
            is read.
    """
    path = Path(source)
    if source == "-" or not (path.is_dir() or is_image(path)):  # frames as they are
        if recipe is not None:
            raise AutodiceError(f"--preprocess: {'stdin' if source == '-' else path} holds no "
                                "images, its frames are fed as they are")
        if source == "-":
            return None, _stdin_frames(shape, dtype)
        batch = _load_batch(path, shape)
        return len(batch), ((str(i), batch[i]) for i in range(len(batch)))
    if path.is_dir():
        images = sorted(p for p in path.iterdir() if is_image(p))
        if not images:
            raise AutodiceError(f"{path}: no images there ({', '.join(IMAGE_SUFFIXES)})")
    elif path.is_file():
        images = [path]
    else:
        raise AutodiceError(f"{path}: no such image")
    recipe = recipe or ImageRecipe()
    channels = (shape[1] if recipe.layout == "nchw" else shape[3]) if len(shape) == 4 else 0
    for key in ("mean", "std"):  # an input that is no image: each frame says so
        values = getattr(recipe, key)
        if channels and len(values) not in (1, channels):
            raise AutodiceError(f"--preprocess {key}={'/'.join(f'{v:g}' for v in values)}: "
                                f"one value, or one per channel of the input ({channels})")
    return len(images), _image_frames(images, shape, dtype, recipe)


def is_image(path: Path) -> bool:
    """Whether ``path`` names an image (by its suffix, as a folder's images are found)."""
    return path.suffix.lower() in IMAGE_SUFFIXES


def is_stream(source: str, shape: tuple[int, ...]) -> bool:
    """Whether ``source`` holds a stream of frames (one image is a stream of one) rather than
    the one frame ``run --frames`` repeats (a ``.npy`` that is neither is left to run's own
    checks, which name what is wrong)."""
    if source == "-" or Path(source).is_dir() or is_image(Path(source)):
        return True
    try:
        a = np.load(source, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError):
        return False
    shape = tuple(shape)
    return a.shape != shape and (a.shape[1:] == shape or (
        shape[:1] == (1,) and a.ndim == len(shape) and a.shape[1:] == shape[1:]))


def _load_batch(path: Path, shape: tuple[int, ...]) -> np.ndarray:
    try:
        a = np.load(path, mmap_mode="r", allow_pickle=False)
    except OSError as e:
        raise AutodiceError(f"{path}: cannot read it ({e.strerror or e})") from None
    except ValueError as e:
        raise AutodiceError(f"{path}: not a .npy array ({e})") from None
    if a.shape == tuple(shape):
        return a[None]
    if a.shape[1:] == tuple(shape):
        return a
    if shape[:1] == (1,) and a.shape[1:] == tuple(shape[1:]):  # frames stacked on the batch axis
        return a[:, None]
    raise AutodiceError(f"{path}: {'x'.join(map(str, a.shape))} is neither one frame nor a batch "
                        f"(N, ...) of frames of {'x'.join(map(str, shape))}")


def _image_frames(images: list[Path], shape, dtype, recipe: ImageRecipe) -> Iterator:
    for i, p in enumerate(images):
        try:
            yield p.name, recipe.apply(p, shape, dtype)
        except Exception as e:  # noqa: BLE001 - any decoder error is this image's problem
            why = str(e).replace(f" '{p}'", "")  # Pillow names the file again
            yield p.name, FrameError(i, f"{p}: cannot make a frame of it ({why})")


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
