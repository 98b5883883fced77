"""``--annotate PATH``: a detector's frames with their boxes drawn, for people to look at.

PATH is a video when it ends like one (``.mp4``, ``.mkv``, ...: every frame in order, at the
source video's rate, H.264 where PyAV's FFmpeg has it, else MPEG-4), else a folder with a
picture a frame (``<source name>.jpg``, or ``<frame index>.jpg`` for a video's frames). Written
as frames come, so a stream cut short still has what was delivered.
"""

from __future__ import annotations

from pathlib import Path

from .video import VIDEO_SUFFIXES

INK = (255, 64, 0)


def draw(picture, detections: list[dict]):
    """``picture`` (a PIL image, or a path) as RGB with each detection's box and name on it."""
    from PIL import Image, ImageDraw

    image = picture.convert("RGB") if isinstance(picture, Image.Image) else \
        Image.open(picture).convert("RGB")
    pen = ImageDraw.Draw(image)
    for d in detections:
        pen.rectangle(d["box"], outline=INK, width=2)
        pen.text((d["box"][0] + 3, d["box"][1] + 2),
                 f"{d.get('label', d['class'])} {d['score']:.2f}", fill=INK)
    return image


class Annotator:
    """Frames with their boxes drawn, into a video or a folder (see the module docstring)."""

    def __init__(self, path: str | Path, rate: float = 25.0):
        self.path, self.rate = Path(path), rate
        self.video = self.path.suffix.lower() in VIDEO_SUFFIXES
        self._out = self._stream = None
        if not self.video:
            self.path.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def of(path: str | Path, source) -> Annotator:
        """The annotator for frames of ``source``: a video keeps the source video's rate
        (pictures: 25 frames/s)."""
        from .video import frame_rate, is_video

        return Annotator(path, (frame_rate(str(source)) if is_video(str(source)) else None)
                         or 25.0)

    def add(self, index: int, label: str, picture, detections: list[dict]) -> None:
        image = draw(picture, detections)
        if not self.video:
            name = Path(label).stem if not label.isdigit() else f"{index:06d}"
            image.save(self.path / f"{name}.jpg", quality=90)
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
