"""Frames from a video: a file FFmpeg reads, an RTSP (or HTTP) stream, a V4L2 camera.

Decoded on the head by PyAV (FFmpeg, from its wheels), lazily, in the session's feeder thread:
the pipeline pulls frames as fast as it takes them, and a frame the decoder cannot make is a
:class:`~autodice.backend.session.gateway.FrameError` in its place (its index named) while the
others go on. A file gives every frame, in order; a live source (a stream URL, a camera) the
newest frame each time the pipeline takes one, the frames it could not take counted as dropped.
A live source that is lost (a network stream that breaks or ends, a camera that goes away) is
opened again after each of :data:`RECONNECT_S`, each attempt said on stderr; if it does not come
back, the stream ends with a :class:`~autodice.core.errors.JobError` naming the source (what was
delivered is kept).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ...core.errors import AutodiceError, JobError
from .gateway import FrameError

VIDEO_SUFFIXES = (".mp4", ".m4v", ".mkv", ".webm", ".avi", ".mov", ".ts", ".mpg", ".mpeg",
                  ".flv", ".y4m")
URL_SCHEMES = ("rtsp://", "rtsps://", "rtmp://", "http://", "https://", "udp://", "tcp://")
OPEN_TIMEOUT_S = 10.0  # a stream that says nothing for this long is not there
RECONNECT_S = (0.5, 1.0, 2.0, 4.0, 8.0)  # waits before each reopening of a lost live source
# Sources that never end on their own: their end is a loss. An HTTP URL may be a file that ends.
_UNENDING = ("rtsp://", "rtsps://", "rtmp://", "udp://", "tcp://", "/dev/video")


def is_video(source: str) -> bool:
    """Whether ``source`` names a video: by its file suffix, a stream URL or ``/dev/videoN``."""
    return (source.startswith(URL_SCHEMES) or source.startswith("/dev/video")
            or Path(source).suffix.lower() in VIDEO_SUFFIXES)


def open_video(source: str):
    """The opened container and its first video stream.

    Raises:
        AutodiceError: ``SOURCE: cannot open ...`` in one line (missing, not a video, no video
            stream, a stream that does not answer), before any frame.
    """
    import av

    if not source.startswith(URL_SCHEMES) and not Path(source).exists():
        raise AutodiceError(f"{source}: no such video")
    options = {"rtsp_transport": "tcp"} if source.startswith(("rtsp://", "rtsps://")) else {}
    try:
        container = av.open(source, format="v4l2" if source.startswith("/dev/video") else None,
                            options=options, timeout=OPEN_TIMEOUT_S)
    except (av.FFmpegError, OSError, ValueError) as e:
        raise AutodiceError(f"{source}: cannot open it as a video ({_why(e)})") from None
    if not container.streams.video:
        container.close()
        raise AutodiceError(f"{source}: holds no video stream")
    stream = container.streams.video[0]
    stream.thread_type = "AUTO"  # FFmpeg's own threads: decoding keeps up with the ranks
    return container, stream


def frame_rate(source: str) -> float | None:
    """The video's frames a second, as its stream says (None: it does not say)."""
    container, stream = open_video(source)
    with container:
        rate = stream.average_rate or stream.guessed_rate
    return float(rate) if rate else None


def is_live(source: str) -> bool:
    """Whether ``source`` is live (a stream URL, a camera): it will not wait for the pipeline."""
    return source.startswith(URL_SCHEMES) or source.startswith("/dev/video")


def video_frames(source: str, make: Callable,
                 live: bool | None = None) -> tuple[int | None, VideoFrames]:
    """(frames in the file if its header says, the ``(label, *made)`` of each frame): ``make``
    turns a decoded frame (PyAV's) into what a source yields after its label. A live
    source (``live``; by default a stream URL or a camera) is read as fast as it comes, and the
    pipeline takes the newest frame each time it takes one (:class:`Newest`)."""
    container, stream = open_video(source)
    if is_live(source) if live is None else live:
        return None, VideoFrames(Newest(_reconnecting(container, stream, source)), source, make)
    return (stream.frames or None), VideoFrames(_pictures(container, stream, source), source,
                                                make)


class VideoFrames:
    """A video's ``(label, *made)``, each frame made as the pipeline takes it; ``dropped``: the
    frames of a live source it did not take (None for a file: every frame is taken)."""

    def __init__(self, pictures, source: str, make: Callable):
        self.pictures, self.source, self.make = pictures, source, make

    @property
    def dropped(self) -> int | None:
        return getattr(self.pictures, "dropped", None)

    def __iter__(self) -> Iterator:
        for i, picture in self.pictures:
            if isinstance(picture, FrameError):
                yield str(i), picture
                continue
            try:
                yield (str(i), *self.make(picture))
            except Exception as e:  # noqa: BLE001 - this frame's problem, named
                yield str(i), FrameError(i, f"{self.source}: frame {i}: cannot make a frame of "
                                            f"it ({e})")


class Newest:
    """The newest of ``items``, which a thread of its own reads as fast as they come: an item
    not taken before the next one comes is dropped (``dropped`` counts them), so a live source
    never waits for the pipeline and a frame is never older than one the pipeline could take.
    What ``items`` raises is raised where the next item is taken."""

    def __init__(self, items: Iterator):
        self.dropped = 0
        self._item: object = None
        self._error: BaseException | None = None
        self._done = False
        self._ready = threading.Condition()
        threading.Thread(target=self._read, args=(items,), name="autodice-live",
                         daemon=True).start()

    def _read(self, items: Iterator) -> None:
        try:
            for item in items:
                with self._ready:
                    self.dropped += self._item is not None
                    self._item = item
                    self._ready.notify()
        except BaseException as e:  # noqa: BLE001 - the taker's to see
            self._error = e
        finally:
            with self._ready:
                self._done = True
                self._ready.notify()

    def __iter__(self) -> Iterator:
        while True:
            with self._ready:
                while self._item is None and not self._done:
                    self._ready.wait()
                item, self._item = self._item, None
                if item is None:
                    if self._error is not None:
                        raise self._error
                    return
            yield item


def _reconnecting(container, stream, source: str) -> Iterator:
    """A live source's ``(index, picture)``, opened again with back-off when it is lost (see
    the module docstring); indices go on across reconnections.

    Raises:
        JobError: the source did not come back after the last attempt.
    """
    import av

    start = 0
    while True:
        ended, lost = True, "it ended"
        try:
            for start, picture in _pictures(container, stream, source, start):
                yield start, picture
                start += 1
        except (av.FFmpegError, OSError) as e:
            ended, lost = False, _why(e)
        if ended and not source.startswith(_UNENDING):
            return  # an HTTP file that ended: done
        for attempt, wait in enumerate(RECONNECT_S, 1):
            print(f"{source}: lost at frame {start} ({lost}); reconnecting in {wait:g} s "
                  f"(attempt {attempt} of {len(RECONNECT_S)})", file=sys.stderr, flush=True)
            time.sleep(wait)
            try:
                container, stream = open_video(source)
                print(f"{source}: back at frame {start}", file=sys.stderr, flush=True)
                break
            except AutodiceError as e:
                lost = e.problems[0].removeprefix(f"{source}: ")
        else:
            n = len(RECONNECT_S)
            raise JobError(f"{source}: lost ({lost}) and not back after {n} attempt"
                           f"{'s' if n != 1 else ''} over {sum(RECONNECT_S):g} s; the frames "
                           "before it were delivered")


def _pictures(container, stream, source: str, start: int = 0) -> Iterator:
    """``(index, PyAV frame)`` of each frame, ``(index, FrameError)`` for one FFmpeg cannot
    decode (the rest go on); indices from ``start``."""
    import av

    i = start
    try:
        for packet in container.demux(stream):
            try:
                decoded = packet.decode()
            except av.FFmpegError as e:  # a corrupt packet: its frame, named; the rest go on
                yield i, FrameError(i, f"{source}: frame {i} cannot be decoded ({_why(e)})")
                i += 1
                continue
            for frame in decoded:
                yield i, frame  # made RGB as it is made a frame, at the frame's size
                i += 1
    finally:
        container.close()


def is_frame(item) -> bool:
    """Whether ``item`` is a decoded video frame (PyAV's), which the pictures' paths scale with
    :func:`scaled` rather than Pillow."""
    return hasattr(item, "reformat") and hasattr(item, "to_image")


def scaled(frame, width: int, height: int, fmt: str = "rgb24"):
    """A decoded frame as ``height x width`` pixels of ``fmt`` (an array), scaled by FFmpeg as
    it converts it: one pass over the small picture, where RGB at the source's size and a
    second resample took two over the large one. Bilinear like Pillow's, with the chroma taken
    at full width (without it a dark grey of 30 came out 28, and a 720p frame at 64x64 was 7
    levels of 255 from Pillow's way on average; with it about 1), on the caller's thread."""
    from av.video.reformatter import Interpolation

    how = Interpolation.BILINEAR | Interpolation.FULL_CHR_H_INT | Interpolation.ACCURATE_RND
    return frame.reformat(width=width, height=height, format=fmt, interpolation=how,
                          threads=1).to_ndarray()


def _why(e: Exception) -> str:
    return str(getattr(e, "strerror", None) or e).strip()
