"""One started job and its gateway's connection: the session's end of the wire.

The gateway (``runtime_cpp/autodice_stream.h``) connects back to a Unix socket of the session's
and says hello: ``ADSTREAM``, then each model input and output (name, dtype, shape). After that
every message has a 16-byte header (kind, reserved, frame id or byte count): a frame is its
inputs' bytes in the hello's order, a result its outputs' bytes; ``STOP`` asks the ranks to
finish and the gateway answers with their figures (``STATS``, JSON). Before a result may come
``RANKS``: every rank's figures so far (``LIVE_FIELDS``), which the ranks send about every
second; the session keeps the latest (:attr:`Gateway.live`) for its metrics.

A :class:`Gateway` is the job and that socket, and nothing of the stream: which frames are in
flight, what to do when the job dies, the figures over many jobs are the session's
(``session.py``). Kept apart so a restart is a new ``Gateway`` and the wire is read in one place.

A gateway on this machine (version 2) takes frames through shared memory: the session offers a
memfd of ``slots`` frames beside a ``SHM`` header, and once taken writes each frame into its slot
and sends the header alone. A frame then costs one copy instead of two through the socket: on
this project's 2-core VM, 0.23 ms less CPU a SqueezeNet frame for the session and its gateway
together, time the ranks' cores had been giving up. A gateway behind ssh's forward gets no fd
and says no; frames then go on the socket as before. Ranks on the gateway's machine map the
same slots and read their inputs there (the gateway's business, not the session's: a slot is
written again only once its frame's result came back, whoever read it).
"""

from __future__ import annotations

import json
import math
import mmap
import os
import select
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...core.errors import AutodiceError, JobError
from ...core.plan import Plan
from .frame_copy import copy_frame, prepare
from .job import Job

_HEADER = struct.Struct("<IIq")  # kind, reserved, frame id or byte count (autodice_stream.h)
_FRAME, _STOP, _RESULT, _STATS, _SHM, _RANKS = 1, 2, 3, 4, 5, 6
# A rank's live figures as the gateway relays them (LiveFigures, runtime_cpp/autodice_stats.h):
# doubles, in this order; the session keeps them by rank without "rank" and "last".
LIVE_FIELDS = ("rank", "last", "frames", "compute_s", "recv_wait_s", "send_wait_s",
               "frame_wait_s", "bytes_sent", "bytes_received", "rss")
_DTYPES = {0: np.dtype("<f4"), 1: np.dtype("<i8")}
START_TIMEOUT_S = 120.0  # loading a large sub-model on a small board takes a while


class FrameError(AutodiceError):
    """One frame the session did not send (it names the frame and the input); the others go on."""

    def __init__(self, index: int, message: str):
        super().__init__(f"frame {index}: {message}")
        self.index = index


class Gone(Exception):
    """The gateway hung up mid-stream: the job ended under the session."""


@dataclass(frozen=True)
class StreamTensor:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        """Elements (math.prod: np.prod costs microseconds a call, and a result asks per frame)."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize


def encode(inputs: list[StreamTensor], frame, index: int) -> list[memoryview]:
    """Frame ``index``'s bytes in the gateway's order, or a FrameError saying what is wrong.

    A frame is an array (a model with one input) or a dict by input name; its shape is the
    input's, with or without the leading batch dimension of 1. Its values are checked as it goes
    out (:meth:`Gateway.stage`: in the pass that copies it into its shared slot).
    """
    if isinstance(frame, dict):
        names = {t.name for t in inputs}
        unknown = sorted(set(frame) - names)
        if unknown:
            raise FrameError(index, f'the model has no input "{unknown[0]}" '
                                    f"(inputs: {', '.join(sorted(names))})")
        by_name = frame
    elif len(inputs) == 1:
        by_name = {inputs[0].name: frame}
    else:
        raise FrameError(index, "the model has inputs "
                         f"{', '.join(t.name for t in inputs)}: give a dict by name")
    parts = []
    for t in inputs:
        if t.name not in by_name:
            raise FrameError(index, f'no array for input "{t.name}"')
        try:
            a = np.asarray(by_name[t.name])
        except Exception as e:  # noqa: BLE001 - whatever the caller passed
            raise FrameError(index, f'input "{t.name}": not an array ({e})') from None
        shape = "x".join(map(str, t.shape))
        if a.shape != t.shape and not (t.shape[:1] == (1,) and a.shape == t.shape[1:]):
            raise FrameError(index, f'input "{t.name}" must be {shape} {t.dtype.name}, got '
                                    f"{'x'.join(map(str, a.shape))} {a.dtype}")
        if a.dtype != t.dtype:
            raise FrameError(index, f'input "{t.name}" must be {t.dtype.name}, got {a.dtype}')
        parts.append(memoryview(np.ascontiguousarray(a)).cast("B"))
    return parts


class Gateway:
    """A started job and its gateway's connection (see the module docstring)."""

    def __init__(self, job: Job, sock: socket.socket, plan: Plan, slots: int = 0):
        """Read the gateway's hello and check it against ``plan``; offer it ``slots`` frames of
        shared memory (0: none). At most ``slots`` frames may be in flight after that.

        Raises:
            AutodiceError: the job ended first, or its program was built from another plan.
        """
        self.job = job
        self._sock: socket.socket | None = sock
        self._slots: list[np.ndarray] = []  # shared frame slots (bytes), if the gateway took them
        self._sent = 0
        self._staged: list[memoryview] | None = None  # the frame in the next slot, checked
        # By rank: its figures so far as it last sent them (about every second while frames flow)
        self.live: dict[int, dict[str, float]] = {}
        try:
            self.inputs, self.outputs, version = self._hello(plan)
            self._result_bytes = sum(t.nbytes for t in self.outputs)
            if slots > 0 and version >= 2:
                self._slots = self._share(slots)
        except BaseException:
            self.hang_up()
            raise

    @classmethod
    def start(cls, start: Callable[[str], Job], path: str, plan: Plan,
              timeout_s: float, slots: int = 0) -> Gateway:
        """Listen on ``path``, start the job (``start`` gets the path) and take its gateway's
        connection; a job that fails or does not connect in time is stopped.

        Raises:
            AutodiceError: the job failed to start (the rank named) or did not start in time.
        """
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
            listener.listen(1)
            job = start(path)
            try:
                return cls(job, _accept(listener, job, timeout_s), plan, slots)
            except BaseException:
                job.stop()
                raise
        finally:
            listener.close()
            Path(path).unlink(missing_ok=True)

    @property
    def closed(self) -> bool:
        return self._sock is None

    @property
    def shared(self) -> bool:
        """Whether frames go through shared memory (the gateway took the offer)."""
        return bool(self._slots)

    def stage(self, index: int, parts: list[memoryview]) -> None:
        """Check the caller's frame ``index`` before it is in flight: a FrameError if an input
        holds NaN or infinity. With shared slots the check is the pass that copies the frame
        into its slot (``frame_copy.py``), and :meth:`send` does not copy it again."""
        slots = self._slots  # hang_up() may empty it under a feeder
        k, at = (self._sent % len(slots) if slots else 0), 0
        for t, p in zip(self.inputs, parts):
            float32 = t.dtype.kind == "f"
            if slots:
                ok = copy_frame(slots[k][at:at + p.nbytes], p, float32)
                at += p.nbytes
            else:
                ok = not float32 or bool(np.isfinite(np.frombuffer(p, t.dtype)).all())
            if not ok:
                raise FrameError(index, f'input "{t.name}" holds NaN or infinite values')
        self._staged = parts if slots else None

    def send(self, fid: int, parts: list[memoryview]) -> None:
        """Frame ``fid`` to the gateway. Raises OSError when the connection is gone.

        With shared slots, the n-th frame sent goes into slot n % slots: the caller keeps at
        most ``slots`` frames in flight, so that slot's last frame has its result back. The
        frame :meth:`stage` copied there last is not copied again (a frame sent again after a
        restart is copied here).
        """
        sock = self._sock
        if sock is None:
            raise OSError("the session's socket is closed")
        slots = self._slots  # as in stage()
        if slots:
            k, at = self._sent % len(slots), 0
            if self._staged is not parts:
                for p in parts:  # checked when first sent
                    copy_frame(slots[k][at:at + p.nbytes], p, False)
                    at += p.nbytes
            self._staged = None
            sock.sendall(_HEADER.pack(_FRAME, k + 1, fid))
            self._sent += 1
            return
        sock.sendall(_HEADER.pack(_FRAME, 0, fid))
        for p in parts:
            sock.sendall(p)

    def wait_for_result(self) -> None:
        """Until a result (or the gateway's hang-up) can be read; a stop raised here leaves
        the wire as it was. Waits in short polls: a signal the kernel handed to another thread
        runs its Python handler here only when the main thread wakes."""
        sock = self._sock
        if sock is not None:
            poll = select.poll()
            poll.register(sock, select.POLLIN)
            while not poll.poll(200):
                pass

    def result(self):
        """The next result: an array (one output) or a dict by output name.

        Raises:
            Gone: the gateway hung up (the job ended).
        """
        # Header and body in one read, as the gateway writes them (mid-stream it sends results
        # alone): a read of the header alone costs a second wake-up whenever the body is late.
        data = self.read(_HEADER.size + self._result_bytes)
        kind, _, n = _HEADER.unpack_from(data)
        while kind == _RANKS:  # the ranks' figures first, then (read in part) the result
            end = _HEADER.size + n
            self._take_live(data[_HEADER.size:end] + self.read(max(0, end - len(data))))
            data = data[end:]
            data += self.read(_HEADER.size + self._result_bytes - len(data))
            kind, _, n = _HEADER.unpack_from(data)
        if kind != _RESULT:
            raise AutodiceError(f"the gateway sent message kind {kind}, expected a result")
        arrays, offset = {}, _HEADER.size
        for t in self.outputs:
            arrays[t.name] = np.frombuffer(data, t.dtype, t.size, offset).reshape(t.shape)
            offset += t.nbytes
        return arrays[self.outputs[0].name] if len(arrays) == 1 else arrays

    def finish(self) -> dict | None:
        """Ask the ranks to finish; their figures (None if the gateway sent none). The
        connection is closed after.

        Raises:
            OSError: the job ended while the session was idle.
            AutodiceError: it ended before it answered (the job's failure).
        """
        self._sock.sendall(_HEADER.pack(_STOP, 0, 0))
        kind, _, n = _HEADER.unpack(self.read(_HEADER.size, "the job ended at close"))
        stats = json.loads(self.read(n, "the job ended at close")) if kind == _STATS else None
        self.hang_up()
        return stats

    def _take_live(self, body: bytes) -> None:
        rows = np.frombuffer(bytes(body), "<f8").reshape(-1, len(LIVE_FIELDS)).tolist()
        # every rank, in rank order; a new dict, so a scrape in another thread reads one whole
        self.live = {k: dict(zip(LIVE_FIELDS[2:], row[2:])) for k, row in enumerate(rows)}

    def read(self, n: int, why: str | None = None) -> bytearray:
        """``n`` bytes off the socket. If the gateway hangs up: ``why`` and the job's failure,
        or (``why`` None: mid-stream) :class:`Gone` for the caller to restart or report."""
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            try:
                k = self._sock.recv_into(view[got:])
            except (OSError, AttributeError):  # AttributeError: our end was closed (None)
                k = 0
            except BaseException:  # Ctrl-C: a message read in part leaves the wire out of step
                if got:
                    self.hang_up()
                raise
            if k == 0:
                if why is None:
                    raise Gone()
                self.hang_up()
                code = self.job.wait(10)
                raise JobError(why, *self.job.failure(code))
            got += k
        return buf

    def hang_up(self) -> None:
        """Close our end: an ssh that forwards it waits for that before it ends (shut down
        first: a feeder blocked in a send wakes up)."""
        sock, self._sock = self._sock, None
        self._slots = []  # the mapping goes with its last view
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _hello(self, plan: Plan) -> tuple[list[StreamTensor], list[StreamTensor], int]:
        """The tensors the gateway carries, checked against the plan, and its version."""
        head = self.read(8 + 12, "the job ended before it was ready")
        if head[:8] != b"ADSTREAM":
            raise AutodiceError("the program's gateway did not say hello: rebuild it "
                                "(`autodice gen` then `autodice build`)")
        version, n_in, n_out = struct.unpack("<III", head[8:])
        tensors = []
        for _ in range(n_in + n_out):
            (n,) = struct.unpack("<I", self.read(4))
            name = self.read(n).decode("utf-8", "surrogateescape")
            dtype, rank = struct.unpack("<II", self.read(8))
            shape = struct.unpack(f"<{rank}q", self.read(8 * rank))
            tensors.append(StreamTensor(name, _DTYPES[dtype], tuple(shape)))
        inputs, outputs = tensors[:n_in], tensors[n_in:]
        want = ({t.name for t in plan.model_inputs}, {t.name for t in plan.model_outputs})
        if ({t.name for t in inputs}, {t.name for t in outputs}) != want:
            raise AutodiceError("the running program was built from another plan: "
                                "run `autodice gen` and `autodice build` again")
        # Frames and results in the model's own shapes (a Mat's form is the same bytes).
        shapes = {t.name: t.onnx_shape for t in (*plan.model_inputs, *plan.model_outputs)}
        inputs, outputs = ([StreamTensor(t.name, t.dtype, shapes[t.name]) for t in ts]
                           for ts in (inputs, outputs))
        # Room for a whole frame in the socket (up to the system's cap): one hand-over, not
        # one per 208 KiB (the default) with the gateway woken for each.
        frame_bytes = sum(t.nbytes for t in inputs) + _HEADER.size
        if frame_bytes > self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF):
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, frame_bytes)
        return inputs, outputs, version

    def _share(self, slots: int) -> list[np.ndarray]:
        """Offer the gateway ``slots`` frames of shared memory; the slots if it took them (none,
        and no offer, where this system has no memfd or no room for one)."""
        frame_bytes = sum(t.nbytes for t in self.inputs)
        try:
            fd = os.memfd_create("autodice-frames", os.MFD_CLOEXEC)
        except (AttributeError, OSError):  # not Linux, or an old kernel
            return []
        try:
            try:
                os.ftruncate(fd, slots * frame_bytes)
                shared = mmap.mmap(fd, slots * frame_bytes)
            except OSError:  # no room: the socket carries the frames
                return []
            socket.send_fds(self._sock, [_HEADER.pack(_SHM, slots, frame_bytes)], [fd])
        finally:
            os.close(fd)  # the mapping and the gateway's copy of the fd keep it
        kind, _, taken = _HEADER.unpack(self.read(_HEADER.size, "the job ended before it was "
                                                                "ready"))
        if kind != _SHM:
            raise AutodiceError(f"the gateway sent message kind {kind}, expected its answer to "
                                "shared frames")
        if not taken:
            shared.close()
            return []
        prepare()  # the copy into a slot, built or loaded before the first frame waits on it
        return [np.frombuffer(shared, np.uint8, frame_bytes, k * frame_bytes)
                for k in range(slots)]


def _accept(listener: socket.socket, job: Job, timeout_s: float) -> socket.socket:
    """The gateway's connection; the job's failure if it ends first."""
    listener.settimeout(0.2)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn, _ = listener.accept()
            conn.settimeout(None)
            return conn
        except TimeoutError:
            pass
        code = job.poll()
        if code is not None:
            raise JobError(*job.failure(code))
        if time.monotonic() > deadline:
            raise AutodiceError(f"the job did not start within {timeout_s:.0f} s")
