"""Frames from a video: a file FFmpeg reads, an RTSP (or HTTP) stream, a V4L2 camera.

Decoded on the head by PyAV (FFmpeg, from its wheels), lazily, in the session's feeder thread:
the pipeline pulls frames as fast as it takes them, and a frame the decoder cannot make is a
:class:`~autodice.backend.session.gateway.FrameError` in its place (its index named) while the
others go on. A file gives every frame, in order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from ...core.errors import AutodiceError
from .gateway import FrameError

VIDEO_SUFFIXES = (".mp4", ".m4v", ".mkv", ".webm", ".avi", ".mov", ".ts", ".mpg", ".mpeg",
                  ".flv", ".y4m")
URL_SCHEMES = ("rtsp://", "rtsps://", "rtmp://", "http://", "https://", "udp://", "tcp://")
OPEN_TIMEOUT_S = 10.0  # a stream that says nothing for this long is not there


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


def video_frames(source: str, make: Callable) -> tuple[int | None, Iterator]:
    """(frames in the file if its header says, the ``(label, *made)`` of each frame): ``make``
    turns a decoded frame (a PIL image) into what a source yields after its label."""
    container, stream = open_video(source)
    return (stream.frames or None), _decoded(container, stream, source, make)


def _decoded(container, stream, source: str, make: Callable) -> Iterator:
    import av

    i = 0
    try:
        for packet in container.demux(stream):
            try:
                decoded = packet.decode()
            except av.FFmpegError as e:  # a corrupt packet: its frame, named; the rest go on
                yield str(i), FrameError(i, f"{source}: frame {i} cannot be decoded ({_why(e)})")
                i += 1
                continue
            for frame in decoded:
                try:
                    yield (str(i), *make(frame.to_image()))
                except Exception as e:  # noqa: BLE001 - this frame's problem, named
                    yield str(i), FrameError(i, f"{source}: frame {i}: cannot make a frame of "
                                                f"it ({e})")
                i += 1
    finally:
        container.close()


def _why(e: Exception) -> str:
    return str(getattr(e, "strerror", None) or e).strip()
