"""What goes into a session and what comes out: the caller's numbers checked up front, the
feeder thread that turns the caller's frames into sends, a slot of the window at a time, and a
detector's or segmenter's results read as boxes or masks."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ...core.errors import AutodiceError
from .frames import image_frame, letterboxed
from .gateway import FrameError, encode


def check_window(window: int | None) -> None:
    """Raises AutodiceError unless ``window`` is None (the default) or at least 1 frame."""
    if window is not None:
        check_count("--window", window, "frame in flight")


def check_count(name: str, value, what: str) -> None:
    """Raises AutodiceError unless ``value`` is a whole number of at least 1 (of ``what``),
    before any process starts: ``open(window="3")`` once died in a comparison, and
    ``window=2.5`` only once the job ran."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise AutodiceError(f"{name} {value!r}: a whole number, at least 1 {what}")


def _take(tokens: queue.SimpleQueue, timeout: float) -> bool:
    """A token from ``tokens`` within ``timeout`` seconds, or False."""
    try:
        tokens.get(timeout=timeout)
        return True
    except queue.Empty:
        return False


@dataclass
class Sent:
    """A frame in flight: kept until its whole result was read, to send again after a restart."""

    index: int  # in the caller's map
    parts: list[memoryview]
    at: float  # perf_counter when first sent: a replayed frame's latency includes the recovery
    box: object = None  # how a picture was letterboxed (its boxes or mask are mapped back)


def feed(frames: Iterable, make: Callable[[object, int], tuple[list[memoryview], object]],
         post: Callable[[int, list[memoryview], object], object], tickets: queue.SimpleQueue,
         slots: queue.SimpleQueue, stop: threading.Event, recovering: bool) -> None:
    """The feeder thread: each of the caller's frames made into its parts and letterbox
    (``make``) and sent (``post``) once a slot of the window is free, a ticket for each in
    order for the reader: ``("frame", i)`` sent, ``("error", FrameError)`` not sent,
    ``("raise", e)`` the caller's iterable (or our code) raised, ``("gone", OSError)`` the
    gateway hung up, ``("end",)``. Ends when ``stop`` is set, at the latest on the caller's
    next frame."""
    try:
        source = iter(frames)
        i = -1
        while True:
            try:  # the caller's iterable: whatever it raises is the caller's error
                frame = next(source)
            except StopIteration:
                return
            except BaseException as e:  # noqa: BLE001 - raised where the caller reads
                tickets.put(("raise", e))
                return
            i += 1
            try:
                if isinstance(frame, FrameError):  # the source could not make it
                    raise frame
                parts, box = make(frame, i)
            except FrameError as e:
                tickets.put(("error", e))
                continue
            while not _take(slots, 0.1):
                if stop.is_set():
                    return
            if stop.is_set():
                return
            try:
                post(i, parts, box)
            except FrameError as e:  # not sent: its slot is free
                slots.put(None)
                tickets.put(("error", e))
                continue
            except OSError:
                if not recovering:
                    raise  # else the reader restarts the job and sends it again
            tickets.put(("frame", i))
    except OSError as e:  # our socket: the gateway is gone, the reader says why
        tickets.put(("gone", e))
    except BaseException as e:  # noqa: BLE001 - a fault of ours: raised in the reader
        tickets.put(("raise", e))
    finally:
        tickets.put(("end",))


def replay(again: list[Sent], send: Callable[[list[memoryview]], None],
           resume: Callable[[], None]) -> None:
    """The replay thread after a restart: the frames in flight sent again to the new job, in
    order (from a thread: the gateway returns results while we send), then the feeder let go."""
    try:
        for sent in again:
            send(sent.parts)
    except OSError:
        pass  # died again: the reader finds out
    finally:
        resume()


def frame_parts(frame, index: int, inputs, recipe, task) -> tuple[list[memoryview], object]:
    """A frame of the caller's as its parts on the wire, and with a ``task`` (a detector's or
    a segmenter's) the letterbox a picture was made with (None for an array: its result stays
    in input pixels)."""
    box = None
    if task is not None:
        frame, box = letterboxed(frame, index, inputs, task.recipe)
    return encode(inputs, image_frame(frame, index, inputs, recipe), index), box


def read_result(result, outputs, task, box):
    """A task's reading of a result (boxes, a mask), by the first output, and by a
    segmenter's prototype masks where the detector has them (``Detect.protos``)."""
    arrays = result if isinstance(result, dict) else {outputs[0].name: result}
    protos = getattr(task, "protos", None)
    if protos:
        return task.read(arrays[outputs[0].name], box, arrays[protos])
    return task.read(arrays[outputs[0].name], box)
