"""Sessions: the distributed program started once, frames streamed through it, results in order.

``open_session(out)`` starts the job with one process more than the plan has ranks: the gateway
(``runtime_cpp/autodice_stream.h``), which connects back to a Unix socket this session listens on.
Frames go down that socket as raw bytes; the gateway hands each frame's model inputs to the
ranks that read them over MPI and sends each frame's outputs back in the order frames came (stage
replicas and split layers included: the ranks are the same program as ``run``'s). Nothing on a
board needs Python: the gateway is the rank program itself, started with ``--stream``.

The models are loaded once; ``map`` keeps up to ``window`` frames in flight, so a slow caller
holds the pipeline back (no result piles up) and a slow pipeline holds the caller back (no frame
piles up). A frame that cannot be sent (wrong shape or dtype, NaN, an input the model does not
have) comes back in its place as a :class:`FrameError`; the others go on. A job that dies ends
the session with a :class:`SessionError` naming the rank and the last frame delivered.

How the job is started and stopped is the launcher's business: every rank here under mpirun
(:class:`LocalJob`), or on deployed hosts (``autodice.deploy.stream``). So is what to do when it
dies: a session given a :class:`Recovery` asks it for the next job (on deployed hosts, a mapping
onto the hosts left: ``autodice.deploy.recover``), starts that, and sends again, in order, every
frame whose result had not come back; the caller's iterator just goes on. A frame is dropped from the
session's keeping only once its whole result was read, so none is lost and none comes twice.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from ..core.errors import AutodiceError
from ..core.plan import Plan
from .failure import explain_failure
from .run import ProcessJob, local_mpirun

_HEADER = struct.Struct("<IIq")  # kind, reserved, frame id or byte count (autodice_stream.h)
_FRAME, _STOP, _RESULT, _STATS = 1, 2, 3, 4
_DTYPES = {0: np.dtype("<f4"), 1: np.dtype("<i8")}
START_TIMEOUT_S = 120.0  # loading a large sub-model on a small board takes a while


class FrameError(AutodiceError):
    """One frame the session did not send (it names the frame and the input); the others go on."""

    def __init__(self, index: int, message: str):
        super().__init__(f"frame {index}: {message}")
        self.index = index


class SessionError(AutodiceError):
    """The job ended under the session. ``delivered``: the index (in the current ``map``) of the
    last frame whose result was handed out, -1 if none: resend the frames after it."""

    def __init__(self, delivered: int, *problems: str):
        super().__init__(*problems)
        self.delivered = delivered


@dataclass(frozen=True)
class StreamTensor:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


class _Gone(Exception):
    """The gateway hung up mid-stream: the job ended under the session."""


@dataclass
class _Sent:
    """A frame in flight: kept until its whole result was read, to send again after a restart."""

    index: int  # in the caller's map
    parts: list[memoryview]
    at: float  # perf_counter when first sent: a replayed frame's latency includes the recovery


@dataclass
class Restart:
    """The next job after the last one died (or a planned move): its plan, how to start it, and
    what the recovery did, for :meth:`Session.stats` (``incidents``)."""

    plan: Plan
    start: Callable[[str], Job]
    incident: dict = field(default_factory=dict)


class Recovery(Protocol):
    """What a session asks when its job dies, or when the caller asks to rebalance."""

    def recover(self, job: Job) -> Restart: ...  # the dead job: stop it, find what was lost
    def rebalance(self) -> Restart | None: ...  # the job for all hosts, ready; None: no move
    def close(self) -> None: ...  # the session ended: nothing of the recovery's left running


class Job(Protocol):
    """A started job: mpirun here, or on a head node over ssh."""

    def poll(self) -> int | None: ...  # exit code once it ended
    def wait(self, timeout: float) -> int | None: ...  # None if still running then
    def stop(self) -> None: ...  # end it now; nothing of it left running anywhere
    def failure(self, code: int | None) -> list[str]: ...  # what brought it down, one line each


class LocalJob(ProcessJob):
    """Every rank and the gateway on this machine under mpirun, output to ``log``."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, plan: Plan):
        super().__init__(argv, log, env)
        self.plan = plan

    def stop(self) -> None:
        if self.proc.poll() is None:  # mpirun ends its ranks on SIGTERM
            self.proc.terminate()
            if self.wait(15) is None:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()

    def failure(self, code: int | None) -> list[str]:
        said = self.log.read_text(errors="replace")
        ranks_said = [ln for ln in said.splitlines() if ln.startswith("[rank")]
        return [f"the job failed (exit {code}):", *explain_failure(self.plan, said),
                *(ranks_said[-5:] or said.strip().splitlines()[-8:]), f"log: {self.log}"]


def local_job(out_dir: Path, plan: Plan, socket_path: str, gpu_fallback: bool = False) -> LocalJob:
    """Start every rank of ``out_dir``'s built program here, plus the gateway on rank 0's core
    (its files beside the socket, in the session's folder)."""
    program = out_dir / "packages" / plan.ranks[0].host / "build" / "program"
    if not program.exists():
        raise AutodiceError(f"{program}: not built; run `autodice build {out_dir}` first")
    workdir = Path(socket_path).parent
    args = ["--models", str(out_dir / "ncnn"), "--stream", socket_path]
    argv, env = local_mpirun(plan, program, workdir, args + (["--gpu-fallback", "cpu"]
                                                             if gpu_fallback else []),
                             gateway=True)
    return LocalJob(argv, env, workdir / "job.log", plan)


class Session:
    """A running job fed frame by frame; see the module docstring. Use as a context manager."""

    def __init__(self, plan: Plan, start: Callable[[str], Job], window: int | None = None,
                 start_timeout_s: float = START_TIMEOUT_S, recovery: Recovery | None = None):
        """Start the job (``start`` gets the socket's path; the job's files may go beside it)
        and wait until every rank has loaded its model.

        Args:
            recovery: asked for the next job when this one dies; None: a death ends the
                session (:class:`SessionError`).
        Raises:
            AutodiceError: the job failed to start (the rank named) or did not start in time.
        """
        self.plan = plan
        self.window = window or 2 * len(plan.ranks) + 2
        self._tmp = Path(tempfile.mkdtemp(prefix="autodice-session-"))
        self._sock: socket.socket | None = None
        self._broken: SessionError | None = None
        self._lock = threading.Lock()
        self._latency: list[float] = []
        self._busy_s = self._last_result = 0.0  # summed over maps: first frame sent to last result delivered
        self._delivered = 0
        self._job_stats: dict | None = None
        self._kept = False
        self._start_timeout_s = start_timeout_s
        self._recovery = recovery
        self._inflight: deque[_Sent] = deque()
        self._sending = threading.Condition()  # guards _inflight, _sock's swap and _paused
        self._paused = False  # a restart is under way: frames wait
        self._move: Restart | None = None  # rebalance() ready, started at the next result
        self._ids = 0
        self._jobs = 0
        self._incidents: list[dict] = []
        try:
            self._sock = self._start(start)
        except BaseException:
            self._abandon(keep=True)
            raise
        self.inputs, self.outputs = self._hello()

    @property
    def recovery(self) -> Recovery | None:
        """What this session asks when its job dies (None: a death ends it)."""
        return self._recovery

    # ---- starting --------------------------------------------------------------------------

    def _start(self, start: Callable[[str], Job]) -> socket.socket:
        """Start a job (it becomes ``self.job``); its gateway's connection, through a socket of
        its own."""
        self._jobs += 1
        path = str(self._tmp / f"stream-{self._jobs}.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
            listener.listen(1)
            self.job = start(path)
            return self._accept(listener, self._start_timeout_s)
        finally:
            listener.close()
            Path(path).unlink(missing_ok=True)

    def _accept(self, listener: socket.socket, timeout_s: float) -> socket.socket:
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
            code = self.job.poll()
            if code is not None:
                raise AutodiceError(*self.job.failure(code))
            if time.monotonic() > deadline:
                raise AutodiceError(f"the job did not start within {timeout_s:.0f} s")

    def _hello(self) -> tuple[list[StreamTensor], list[StreamTensor]]:
        """The tensors the gateway carries, checked against the plan."""
        head = self._read(8 + 12, "the job ended before it was ready")
        if head[:8] != b"ADSTREAM":
            raise AutodiceError("the program's gateway did not say hello: rebuild it "
                                "(`autodice gen` then `autodice build`)")
        _, n_in, n_out = struct.unpack("<III", head[8:])
        tensors = []
        for _ in range(n_in + n_out):
            (n,) = struct.unpack("<I", self._read(4))
            name = self._read(n).decode("utf-8", "surrogateescape")
            dtype, rank = struct.unpack("<II", self._read(8))
            shape = struct.unpack(f"<{rank}q", self._read(8 * rank))
            tensors.append(StreamTensor(name, _DTYPES[dtype], tuple(shape)))
        inputs, outputs = tensors[:n_in], tensors[n_in:]
        want = ({t.name for t in self.plan.model_inputs}, {t.name for t in self.plan.model_outputs})
        if ({t.name for t in inputs}, {t.name for t in outputs}) != want:
            raise AutodiceError("the running program was built from another plan: "
                                "run `autodice gen` and `autodice build` again")
        # Room for a whole frame in the socket (up to the system's cap): one hand-over, not
        # one per 208 KiB (the default) with the gateway woken for each.
        frame_bytes = sum(t.nbytes for t in inputs) + _HEADER.size
        if frame_bytes > self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF):
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, frame_bytes)
        return inputs, outputs

    # ---- the stream ------------------------------------------------------------------------

    def map(self, frames: Iterable) -> Iterator:
        """Each frame's result, in input order, while up to ``window`` frames are in flight.

        A frame is an array (a model with one input) or a dict by input name; its shape is the
        input's, with or without the leading batch dimension of 1. A result is an array (a model
        with one output) or a dict by output name. A frame that cannot be sent is yielded as a
        :class:`FrameError` in its place.

        Raises:
            SessionError: the job ended (a rank died); ``delivered`` says what arrived.
        """
        if not self._lock.acquire(blocking=False):
            raise AutodiceError("this session is already streaming (one map at a time)")
        try:
            yield from self._stream(frames)
        finally:
            self._lock.release()

    def infer(self, frame):
        """One frame's result, blocking.

        Raises:
            FrameError: the frame cannot be sent.
            SessionError: the job ended.
        """
        if not self._lock.acquire(blocking=False):
            raise AutodiceError("this session is already streaming (one map at a time)")
        try:
            self._check_open()
            parts = self.encode(frame, 0)
            try:  # no feeder thread for one frame: starting one costs latency
                self._post(0, parts)
            except OSError:
                if self._recovery is None:
                    self._fail(-1)
            try:
                sent, result = self._next_result(-1)
            except SessionError:
                raise
            except BaseException:  # Ctrl-C between the frame and its result: out of step
                self._abandon()
                raise
            self._account(sent.at, first=True)
            return result
        finally:
            self._lock.release()

    def rebalance(self) -> None:
        """Move back to the best job for every host (after one that was lost came back), without
        losing a frame: the new job is deployed now (the running one goes on meanwhile) and
        started at once when no stream runs, else before the stream's next result.

        Raises:
            AutodiceError: this session cannot move (opened without recovery), or a lost host
                still does not answer (nothing changed).
        """
        if self._recovery is None:
            raise AutodiceError("this session was opened without recovery: nothing to rebalance")
        self._check_open()
        self._move = self._recovery.rebalance()
        if self._move is not None and self._lock.acquire(blocking=False):
            try:
                self._moved(-1)
            finally:
                self._lock.release()

    def _post(self, index: int, parts: list[memoryview]) -> _Sent:
        """Keep a frame until its result is read, and send it to the gateway (once no restart is
        under way). An OSError means the job is gone: the reader restarts it and sends the frame
        again, or says why."""
        with self._sending:
            while self._paused:
                self._sending.wait()
            sent = _Sent(index, parts, time.perf_counter())
            self._inflight.append(sent)
            sock = self._sock
        if sock is None:  # hung up under a feeder: the reader says why
            raise OSError("the session's socket is closed")
        self._send(sock, parts)
        return sent

    def _send(self, sock: socket.socket, parts: list[memoryview]) -> None:
        fid = self._ids
        self._ids += 1
        sock.sendall(_HEADER.pack(_FRAME, 0, fid))
        for p in parts:
            sock.sendall(p)

    def _account(self, sent: float, first: bool) -> None:
        """A result delivered: its latency, and the busy time (from the first frame sent, or
        the last result, to now)."""
        now = time.perf_counter()
        self._busy_s += now - (sent if first else self._last_result)
        self._last_result = now
        self._delivered += 1
        self._latency.append(now - sent)

    def _stream(self, frames: Iterable) -> Iterator:
        self._check_open()
        tickets: queue.Queue = queue.Queue()
        slots = threading.Semaphore(self.window)
        stop = threading.Event()
        recovering = self._recovery is not None

        def feed() -> None:
            try:
                for i, frame in enumerate(frames):
                    try:
                        if isinstance(frame, FrameError):  # the source could not make it
                            raise frame
                        parts = self.encode(frame, i)
                    except FrameError as e:
                        tickets.put(("error", e))
                        continue
                    while not slots.acquire(timeout=0.1):
                        if stop.is_set():
                            return
                    if stop.is_set():
                        return
                    tickets.put(("frame", i))
                    try:
                        self._post(i, parts)
                    except OSError:
                        if not recovering:
                            raise  # else the reader restarts the job and sends it again
            except OSError as e:  # the gateway is gone: the reader says why
                tickets.put(("gone", e))
            except BaseException as e:  # the caller's iterable raised: raise it there
                tickets.put(("raise", e))
            finally:
                tickets.put(("end",))

        feeder = threading.Thread(target=feed, name="autodice-feed", daemon=True)
        feeder.start()
        last = -1
        clean = False
        try:
            while True:
                ticket = tickets.get()
                kind = ticket[0]
                if kind == "end":
                    clean = True
                    return
                if kind == "raise":
                    raise ticket[1]
                if kind == "error":
                    yield ticket[1]
                    continue
                if kind == "gone":
                    self._fail(last)
                sent, result = self._next_result(last)
                slots.release()
                self._account(sent.at, first=last < 0)
                last = sent.index
                yield result
        finally:
            stop.set()
            if not clean and self._broken is None:
                self._drain(tickets, last)
            # A feeder inside the caller's iterable (a camera that blocks) ends on its next frame.
            feeder.join(timeout=None if self._broken is None else 1.0)

    def _drain(self, tickets: queue.Queue, last: int) -> None:
        """The caller stopped early: take the results of frames already sent, so the stream is
        in step for the next map; a session that cannot is closed."""
        try:
            while True:
                ticket = tickets.get()
                if ticket[0] == "end":
                    return
                if ticket[0] == "frame":
                    self._next_result(last)
                elif ticket[0] == "gone":
                    self._fail(last)
        except BaseException:
            self._abandon()
            raise

    def encode(self, frame, index: int) -> list[memoryview]:
        """A frame's bytes in the gateway's order, or a FrameError saying what is wrong."""
        if isinstance(frame, dict):
            names = {t.name for t in self.inputs}
            unknown = sorted(set(frame) - names)
            if unknown:
                raise FrameError(index, f'the model has no input "{unknown[0]}" '
                                        f"(inputs: {', '.join(sorted(names))})")
            by_name = frame
        elif len(self.inputs) == 1:
            by_name = {self.inputs[0].name: frame}
        else:
            raise FrameError(index, "the model has inputs "
                             f"{', '.join(t.name for t in self.inputs)}: give a dict by name")
        parts = []
        for t in self.inputs:
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
            if a.dtype.kind == "f" and not np.isfinite(a).all():
                raise FrameError(index, f'input "{t.name}" holds NaN or infinite values')
            parts.append(memoryview(np.ascontiguousarray(a)).cast("B"))
        return parts

    def _next_result(self, last: int) -> tuple[_Sent, object]:
        """The oldest frame in flight and its result; a job that dies on the way is restarted
        (with recovery) and the frames in flight sent again."""
        if self._move is not None:
            self._moved(last)
        while True:
            try:
                result = self._result()
            except _Gone:
                self._lost(last)
                continue
            with self._sending:
                sent = self._inflight.popleft()
            if self._incidents and "first_result_s" not in self._incidents[-1]:
                incident = self._incidents[-1]
                incident["first_result_s"] = round(time.monotonic() - incident.pop("_t0"), 3)
            return sent, result

    def _result(self):
        """The next result off the socket: an array, or a dict by output name."""
        header = self._read(_HEADER.size)
        kind, _, _ = _HEADER.unpack(header)
        if kind != _RESULT:
            raise AutodiceError(f"the gateway sent message kind {kind}, expected a result")
        data = self._read(sum(t.nbytes for t in self.outputs))
        arrays, offset = {}, 0
        for t in self.outputs:
            arrays[t.name] = np.frombuffer(data, t.dtype, int(np.prod(t.shape)), offset) \
                .reshape(t.shape)
            offset += t.nbytes
        return arrays[self.outputs[0].name] if len(arrays) == 1 else arrays

    def _read(self, n: int, why: str | None = None) -> bytearray:
        """``n`` bytes off the socket. If the gateway hangs up: ``why`` and the job's failure,
        or (``why`` None: mid-stream) :class:`_Gone` for the caller to restart or report."""
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            try:
                k = self._sock.recv_into(view[got:])
            except (OSError, AttributeError):  # AttributeError: our end was closed (None)
                k = 0
            if k == 0:
                if why is None:
                    raise _Gone()
                self._hang_up()
                code = self.job.wait(10)
                raise AutodiceError(why, *self.job.failure(code))
            got += k
        return buf

    def _lost(self, last: int) -> None:
        """The job died mid-stream: restart it through the recovery, or end the session."""
        if self._recovery is None:
            self._fail(last)
        t0 = time.monotonic()
        self._pause()
        try:
            restart = self._recovery.recover(self.job)
        except AutodiceError as e:
            self._fail(last, e.problems)
        except BaseException:  # Ctrl-C while recovering: nothing left running
            self._broken = SessionError(last, "the session was interrupted while recovering")
            self._resume()
            self._abandon(keep=True)
            raise
        self._restart(restart, t0, last)

    def _moved(self, last: int) -> None:
        """rebalance(): its job started, the frames in flight sent to it again."""
        restart, self._move = self._move, None
        t0 = time.monotonic()
        self._pause()
        self._restart(restart, t0, last)

    def _pause(self) -> None:
        """No frame goes out until :meth:`_resume`; our end of the job's stream is closed."""
        with self._sending:
            self._paused = True
        self._hang_up()

    def _resume(self) -> None:
        with self._sending:
            self._paused = False
            self._sending.notify_all()

    def _restart(self, restart: Restart, t0: float, last: int) -> None:
        """Start ``restart``'s job, then send it every frame still in flight, in order (from a
        thread: the gateway returns results while we send), then let the feeder go on."""
        t1 = time.monotonic()
        self.job.stop()  # a recovery stopped it already; a move has not
        try:
            self._sock = self._start(restart.start)
            self.inputs, self.outputs = self._hello()
        except AutodiceError as e:
            self._fail(last, ["the restarted job failed:", *e.problems])
        except BaseException:
            self._broken = SessionError(last, "the session was interrupted while restarting")
            self._resume()
            self._abandon(keep=True)
            raise
        self.plan = restart.plan
        with self._sending:
            again = list(self._inflight)
        self._incidents.append({**restart.incident, "replayed": len(again),
                               "after_frame": last, "restart_s": round(time.monotonic() - t1, 3),
                               "_t0": t0})
        sock = self._sock

        def replay() -> None:
            try:
                for sent in again:
                    self._send(sock, sent.parts)
            except OSError:
                pass  # died again: the reader finds out
            finally:
                self._resume()

        threading.Thread(target=replay, name="autodice-replay", daemon=True).start()

    def _fail(self, last: int, problems: list[str] | None = None):
        """The job ended mid-stream for good. Say which rank, and what arrived."""
        self._hang_up()
        if problems is None:
            code = self.job.wait(15)
            problems = self.job.failure(code)
        self._broken = SessionError(last, *problems, f"the last frame delivered: {last}"
                                    if last >= 0 else "no frame of this stream was delivered")
        self._resume()  # a feeder waiting on a restart finds the socket closed and ends
        self._abandon(keep=True)
        raise self._broken

    def _check_open(self) -> None:
        if self._broken is not None:
            raise self._broken
        if self._sock is None:
            raise AutodiceError("this session is closed")

    # ---- the end ---------------------------------------------------------------------------

    def stats(self) -> dict:
        """Frames delivered, frames/s, end-to-end latency (p50/p90/p99, seconds) and, once
        closed, the job's own figures per rank (``ranks``: compute and wait seconds, bytes, peak
        memory) with each rank's share of a frame (``ms_per_frame``)."""
        lat = np.array(self._latency) if self._latency else np.zeros(1)
        seconds = self._busy_s
        out = {"frames": self._delivered, "seconds": seconds,
               "fps": self._delivered / seconds if seconds > 0 else 0.0,
               "latency_s": {"p50": float(np.percentile(lat, 50)),
                             "p90": float(np.percentile(lat, 90)),
                             "p99": float(np.percentile(lat, 99)),
                             "mean": float(lat.mean())},
               "window": self.window}
        if self._recovery is not None:
            out["incidents"] = [{k: v for k, v in i.items() if not k.startswith("_")}
                                for i in self._incidents]
        if self._job_stats:
            ranks = []
            for r in self._job_stats["ranks"]:
                n = max(1, r["frames"])
                ranks.append({**r, "ms_per_frame": {
                    "compute": 1e3 * r["compute_s"] / n, "recv_wait": 1e3 * r["recv_wait_s"] / n,
                    "send_wait": 1e3 * r["send_wait_s"] / n}})
            out["ranks"] = ranks
        return out

    def close(self) -> None:
        """Stop the stream: the ranks finish, report and exit; nothing is left running."""
        if self._sock is None:
            return
        try:
            if self._broken is None:
                try:
                    self._sock.sendall(_HEADER.pack(_STOP, 0, 0))
                except OSError:  # the job ended while the session was idle
                    self._fail(-1)
                kind, _, n = _HEADER.unpack(self._read(_HEADER.size, "the job ended at close"))
                if kind == _STATS:
                    self._job_stats = json.loads(self._read(n, "the job ended at close"))
                self._hang_up()
                code = self.job.wait(60)
                if code not in (0, None):
                    self._abandon(keep=True)
                    raise AutodiceError(*self.job.failure(code))
        finally:
            self._abandon()

    def _hang_up(self) -> None:
        """Close our end of the stream: an ssh that forwards it waits for that before it ends
        (shut down first: a feeder blocked in a send wakes up)."""
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
            self._sock = None

    def _abandon(self, keep: bool = False) -> None:
        """Close the socket and stop the job if it still runs; remove the session's folder
        unless ``keep`` (a failure: its log is named in the error)."""
        self._hang_up()
        job = getattr(self, "job", None)
        try:
            if job is not None:
                job.stop()
        finally:
            if self._recovery is not None:
                self._recovery.close()
        if not keep and self._tmp.exists() and not self._kept:
            shutil.rmtree(self._tmp, ignore_errors=True)
        self._kept = self._kept or keep

    def __enter__(self) -> Session:
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.close()
        else:  # an error or Ctrl-C: no waiting on a clean stop
            if self._sock is not None and self._broken is None:
                try:
                    self.close()
                    return
                except Exception:  # noqa: BLE001 - the caller's error is the one to see
                    pass
            self._abandon()


def open_session(out_dir: str | Path, window: int | None = None,
                 gpu_fallback: bool = False) -> Session:
    """A session over every rank of ``out_dir``'s built program on this machine.

    Raises:
        AutodiceError: not built, or the job failed to start (the rank named).
    """
    from ..core.plan import load_plan

    out_dir = Path(out_dir)
    plan = load_plan(out_dir)
    return Session(plan, lambda path: local_job(out_dir, plan, path, gpu_fallback), window)
