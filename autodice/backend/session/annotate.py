"""``--annotate PATH``: a detector's frames with their boxes drawn (a segmenter's with its mask
laid over them), for people to look at.

PATH is a video when it ends like one (``.mp4``, ``.mkv``, ...: every frame in order, at the
source video's rate, H.264 where PyAV's FFmpeg has it, else MPEG-4), else a folder with a
picture a frame (``<source name>.jpg``, or ``<frame index>.jpg`` for a video's frames). Written
as frames come, so a stream cut short still has what was delivered.
"""

from __future__ import annotations

from pathlib import Path

from .video import VIDEO_SUFFIXES

INK = (255, 64, 0)


def draw(picture, read, labels: list[str] | None = None):
    """``picture`` (a PIL image, a video frame or a path) as RGB with a task's reading drawn: each
    detection's box and name (:class:`~.detect.Detection`; a segmenter's detection's mask
    too, half covering its pixels in its class's colour), or a mask's classes in their
    palette colours, half covering the picture (:class:`~.segment.Mask`; class 0, the
    background, left clear)."""
    from PIL import Image, ImageDraw

    from .palette import PALETTE
    from .segment import Mask
    from .video import is_frame

    if is_frame(picture):
        picture = picture.to_image()
    image = picture.convert("RGB") if isinstance(picture, Image.Image) else \
        Image.open(picture).convert("RGB")
    if isinstance(read, Mask):
        colours = read.picture().convert("RGB")
        if colours.size != image.size:
            colours = colours.resize(image.size, Image.NEAREST)
        seen = Image.fromarray(((read.classes != 0) * 128).astype("uint8"), "L")
        image.paste(colours, (0, 0), seen.resize(image.size, Image.NEAREST))
        return image
    masks = [d for d in read if d.mask is not None and d.mask.shape == image.size[::-1]]
    for d in reversed(masks):  # a segmenter's instances, the best on top, in its class's colour
        colour = Image.new("RGB", image.size, tuple(PALETTE[3 * (d.cls % 255 + 1):][:3]))
        image.paste(colour, (0, 0), Image.fromarray((d.mask * 128).astype("uint8"), "L"))
    pen = ImageDraw.Draw(image)
    for d in read:
        pen.rectangle(d.box, outline=INK, width=2)
        name = labels[d.cls] if labels and 0 <= d.cls < len(labels) else d.cls
        pen.text((d.box[0] + 3, d.box[1] + 2), f"{name} {d.score:.2f}", fill=INK)
    return image


def picture_name(index: int, label: str) -> str:
    """A frame's file name without suffix: its source's (an image's stem), or its index for
    a video's or a batch's frames."""
    return Path(label).stem if not label.isdigit() else f"{index:06d}"


class Annotator:
    """Frames with their boxes drawn, into a video or a folder (see the module docstring)."""

    def __init__(self, path: str | Path, rate: float = 25.0, labels: list[str] | None = None):
        self.path, self.rate, self.labels = Path(path), rate, labels
        self.video = self.path.suffix.lower() in VIDEO_SUFFIXES
        self._out = self._stream = None
        if not self.video:
            self.path.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def of(path: str | Path, source, labels: list[str] | None = None) -> Annotator:
        """The annotator for frames of ``source``: a video keeps the source video's rate
        (pictures: 25 frames/s); boxes are named by ``labels`` when given."""
        from .video import frame_rate, is_video

        return Annotator(path, (frame_rate(str(source)) if is_video(str(source)) else None)
                         or 25.0, labels)

    def add(self, index: int, label: str, picture, read) -> None:
        """Frame ``index`` (named ``label``), its ``picture`` with the task's ``read`` drawn."""
        image = draw(picture, read, self.labels)
        if not self.video:
            image.save(self.path / f"{picture_name(index, label)}.jpg", quality=90)
            return
        import av

        if self._out is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._out = av.open(str(self.path), "w")
            codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
            self._stream = self._out.add_stream(codec, rate=round(self.rate) or 25)
            # 4:2:0 wants even sides
            self._stream.width, self._stream.height = (image.width // 2 * 2,
                                                       image.height // 2 * 2)
            self._stream.pix_fmt = "yuv420p"
        if image.size != (self._stream.width, self._stream.height):
            image = image.resize((self._stream.width, self._stream.height))
        for packet in self._stream.encode(av.VideoFrame.from_image(image)):
            self._out.mux(packet)

    def close(self) -> None:
        if self._out is not None:
            for packet in self._stream.encode():
                self._out.mux(packet)
            self._out.close()
            self._out = None
