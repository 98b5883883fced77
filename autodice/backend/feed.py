"""Where a stream's frames come from: tickets, in input order, for the session's reader.

A ticket is ``("frame", i)`` for frame ``i`` sent, ``("error", FrameError)`` for one that could
not be, ``("gone", OSError)`` when the gateway hung up under a send (with no recovery to send it
again), ``("raise", exception)`` when the caller's frames raised, and ``("end",)`` after the
last. Two sources make them, with one interface (``next``, ``took``, ``stop``, ``join``):

- :class:`Feeder`: any iterable, sent by a thread of its own, so a source that blocks (a camera
  waiting for its next picture) does not hold back the results of frames already sent;
- :class:`Inline`: a sequence (a list, a tuple, an array of frames), sent from the caller's own
  thread each time it asks for a ticket. Nothing in memory blocks, and the feeder's hand-offs
  (two threads waking each other for every frame, on cores the ranks compute on) cost
  SqueezeNet's session 7 % of its frames/s on two cores (8 rounds in turns, 2026-11-26).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from .gateway import FrameError, StreamTensor, encode

Post = Callable[[int, list[memoryview]], object]  # keep frame i in flight and send its bytes
Ticket = tuple


def source(frames: Iterable, inputs: list[StreamTensor], window: int, post: Post,
           recovering: bool) -> Feeder | Inline:
    """The source for ``frames``: :class:`Inline` for a sequence, else :class:`Feeder`.

    ``recovering``: a send that fails is left to the reader (it restarts the job and sends the
    frames in flight again), not a ``"gone"`` ticket.
    """
    kind = Inline if isinstance(frames, (Sequence, np.ndarray)) else Feeder
    return kind(frames, inputs, window, post, recovering)


def _parts(inputs: list[StreamTensor], frame, index: int) -> list[memoryview]:
    """The frame's bytes, or the FrameError its source put in its place or encode found."""
    if isinstance(frame, FrameError):  # the source could not make it
        raise frame
    return encode(inputs, frame, index)


class Feeder:
    """Any iterable's frames, sent by a thread while up to ``window`` are in flight."""

    def __init__(self, frames: Iterable, inputs: list[StreamTensor], window: int, post: Post,
                 recovering: bool):
        self._tickets: queue.Queue = queue.Queue()
        self._slots = threading.Semaphore(window)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._feed, name="autodice-feed", daemon=True,
                                        args=(frames, inputs, post, recovering))
        self._thread.start()

    def _feed(self, frames: Iterable, inputs: list[StreamTensor], post: Post,
              recovering: bool) -> None:
        try:
            for i, frame in enumerate(frames):
                try:
                    parts = _parts(inputs, frame, i)
                except FrameError as e:
                    self._tickets.put(("error", e))
                    continue
                while not self._slots.acquire(timeout=0.1):
                    if self._stop.is_set():
                        return
                if self._stop.is_set():
                    return
                self._tickets.put(("frame", i))
                try:
                    post(i, parts)
                except OSError:
                    if not recovering:
                        raise  # else the reader restarts the job and sends it again
        except OSError as e:  # the gateway is gone: the reader says why
            self._tickets.put(("gone", e))
        except BaseException as e:  # the caller's iterable raised: raise it there
            self._tickets.put(("raise", e))
        finally:
            self._tickets.put(("end",))

    def next(self) -> Ticket:
        return self._tickets.get()

    def took(self) -> None:
        """A result was read: room for one more frame."""
        self._slots.release()

    def stop(self) -> None:
        """Send no more frames; the tickets of those sent still come, then ``("end",)``."""
        self._stop.set()

    def join(self, timeout: float | None) -> None:
        # A feeder inside the caller's iterable (a camera that blocks) ends on its next frame.
        self._thread.join(timeout)


class Inline:
    """A sequence's frames, sent from the caller's thread while up to ``window`` are in flight:
    each ticket asked for first tops the window up."""

    def __init__(self, frames: Sequence, inputs: list[StreamTensor], window: int, post: Post,
                 recovering: bool):
        self._frames = enumerate(frames)
        self._inputs, self._window, self._post = inputs, window, post
        self._recovering = recovering
        self._tickets: deque[Ticket] = deque()
        self._in_flight = 0
        self._done = False

    def next(self) -> Ticket:
        while not self._done and self._in_flight < self._window:
            try:
                i, frame = next(self._frames)
            except StopIteration:
                self._done = True
                break
            except Exception as e:  # noqa: BLE001 - the sequence raised: raise it in its place
                self._tickets.append(("raise", e))
                self._done = True
                break
            try:
                parts = _parts(self._inputs, frame, i)
            except FrameError as e:
                self._tickets.append(("error", e))
                continue
            self._tickets.append(("frame", i))
            self._in_flight += 1
            try:
                self._post(i, parts)
            except OSError as e:
                if not self._recovering:  # else the reader restarts the job and sends it again
                    self._tickets.append(("gone", e))
                    self._done = True
        return self._tickets.popleft() if self._tickets else ("end",)

    def took(self) -> None:
        """A result was read: room for one more frame."""
        self._in_flight -= 1

    def stop(self) -> None:
        """Send no more frames; the tickets of those sent still come, then ``("end",)``."""
        self._done = True

    def join(self, timeout: float | None) -> None:
        """Nothing to wait for: no thread of its own."""
