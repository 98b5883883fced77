"""Sessions: the distributed program started once, frames streamed through it, results in order.

``run.open_session(out)`` starts the job with one process more than the plan has ranks: the
gateway (``runtime_cpp/autodice_stream.h``), which connects back to a Unix socket this session
listens on. Frames go down that socket as raw bytes; the gateway hands each frame's model inputs
to the ranks that read them over MPI and sends each frame's outputs back in the order frames came
(stage replicas and split layers included: the ranks are the same program as ``run``'s). Nothing
on a board needs Python: the gateway is the rank program itself, started with ``--stream``.

The models are loaded once; ``map`` keeps up to ``window`` frames in flight, so a slow caller
holds the pipeline back (no result piles up) and a slow pipeline holds the caller back (no frame
piles up). A frame that cannot be sent (wrong shape or dtype, NaN, an input the model does not
have) comes back in its place as a :class:`FrameError`; the others go on. A job that dies ends
the session with a :class:`SessionError` naming the rank and the last frame delivered.

The job's start, its stop and what follows its death are the launcher's (``job.py``): a session
given a :class:`~autodice.backend.job.Recovery` starts the next job it gets and sends again, in
order, every frame whose result had not come back; the caller's iterator just goes on. A frame is
dropped from the session's keeping only once its whole result was read, so none is lost and none
comes twice. The wire to the gateway, and the job under it, is ``gateway.py``'s.
"""

from __future__ import annotations

import queue
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator

from ...core.errors import AutodiceError, JobError
from ...core.plan import Plan
from ...core.stops import stops_held
from .feed import Sent, check_window, feed, frame_parts, read_result, replay
from .figures import Boards, Figures
from .frames import ImageRecipe
from .gateway import START_TIMEOUT_S, Gateway, Gone, StreamTensor
from .job import Job, Recovery, Restart, SessionError, session_folder
from .metrics import Metrics
from .segment import Task


class Session:
    """A running job fed frame by frame; see the module docstring. Use as a context manager."""

    def __init__(self, plan: Plan, start: Callable[[str], Job], window: int | None = None,
                 start_timeout_s: float = START_TIMEOUT_S, recovery: Recovery | None = None,
                 boards: Boards | None = None):
        """Start the job (``start`` gets the socket's path; the job's files may go beside it)
        and wait until every rank has loaded its model.

        Args:
            recovery: asked for the next job when this one dies; None: a death ends the
                session (:class:`SessionError`).
            boards: the deployed boards' sensors, read while the session runs.
        Raises:
            AutodiceError: the job failed to start (the rank named) or did not start in time.
        """
        check_window(window)
        self.plan = plan
        self.window = window or 2 * len(plan.ranks) + 2
        self._tmp = session_folder()
        self._gw: Gateway | None = None  # the running job and its gateway's connection
        self._broken: SessionError | None = None
        self._lock = threading.Lock()
        self._figures = Figures(boards=boards)
        self._job_stats: dict | None = None
        self._kept = False
        self._metrics: Metrics | None = None
        self._start_timeout_s = start_timeout_s
        self._recovery = recovery
        self._inflight: deque[Sent] = deque()
        self._sending = threading.Condition()  # guards _inflight, _gw's swap and _paused
        self._paused = False  # a restart is under way: frames wait
        self._pauses = 0  # restarts begun: a replay ends only the pause it was started in
        self._move: Restart | None = None  # rebalance() ready, started at the next result
        self._ids = self._jobs = 0  # frames sent (each its id), jobs started
        self._frames_via = "socket"
        self.preprocess = ImageRecipe()  # how an image given as a frame becomes one
        self.task: Task | None = None  # set: pictures letterboxed, results read
        try:
            self._gw = self._start(start, plan)
        except BaseException:
            self._abandon(keep=True)
            raise

    @property
    def inputs(self) -> list[StreamTensor]:
        """The model inputs a frame holds, as the running program's gateway said."""
        return self._gw.inputs

    @property
    def outputs(self) -> list[StreamTensor]:
        """The model outputs a result holds."""
        return self._gw.outputs

    @property
    def recovery(self) -> Recovery | None:
        """What this session asks when its job dies (None: a death ends it)."""
        return self._recovery

    def _start(self, start: Callable[[str], Job], plan: Plan) -> Gateway:
        """Start a job, its gateway connected through a socket of its own (frames through shared
        memory if it runs on this machine: ``gateway.py``)."""
        self._jobs += 1
        gw = Gateway.start(start, str(self._tmp / f"stream-{self._jobs}.sock"), plan,
                           self._start_timeout_s, slots=self.window)
        self._frames_via = "shared memory" if gw.shared else "socket"
        return gw

    def map(self, frames: Iterable) -> Iterator:
        """Each frame's result, in input order, while up to ``window`` frames are in flight.

        A frame is an array (a model with one input) or a dict by input name; its shape is the
        input's, with or without the leading batch dimension of 1. Or an image, a path, a PIL
        image or a decoded video frame (PyAV's), made a frame by :attr:`preprocess` (ImageNet's
        recipe unless set; a detector's letterbox). A result is
        an array (a model with one output) or a dict by output name. A frame that cannot be
        sent is yielded as a :class:`FrameError` in its place.

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
        """One frame's result, blocking; raises FrameError if the frame cannot be sent,
        SessionError if the job ended."""
        if not self._lock.acquire(blocking=False):
            raise AutodiceError("this session is already streaming (one map at a time)")
        try:
            self._check_open()
            parts, box = self._make(frame, 0)
            try:  # no feeder thread for one frame: starting one costs latency
                self._post(0, parts, box)
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
            self._figures.delivered_one(sent.at, first=True)
            return self._read(sent, result)
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

    def _make(self, frame, index: int):
        return frame_parts(frame, index, self.inputs, self.preprocess, self.task)

    def _read(self, sent: Sent, result):
        return result if self.task is None else read_result(result, self.outputs, self.task,
                                                            sent.box)

    def _post(self, index: int, parts: list[memoryview], box=None) -> Sent:
        """Check a frame, keep it until its result is read, and send it to the gateway (once no
        restart is under way). A FrameError leaves nothing in flight. An OSError means the job
        is gone: the reader restarts it and sends the frame again, or says why."""
        with self._sending:
            while self._paused:
                self._sending.wait()
            at = time.perf_counter()
            gw = self._gw
            gw.stage(index, parts)  # before a restart could send it again unchecked
            sent = Sent(index, parts, at, box)
            self._inflight.append(sent)
        self._send(gw, parts)  # OSError if hung up under a feeder: the reader says why
        return sent

    def _send(self, gw: Gateway, parts: list[memoryview]) -> None:
        fid = self._ids
        self._ids += 1
        gw.send(fid, parts)

    def _stream(self, frames: Iterable) -> Iterator:
        self._check_open()
        # SimpleQueues, not Queue and Semaphore: those hand over through Python-level conditions,
        # and every CPU microsecond of the feed is taken from a rank's core when ranks fill them
        # all (SqueezeNet on 2 cores: 0.23 -> 0.20 ms of Python a frame). A slot is a token.
        tickets: queue.SimpleQueue = queue.SimpleQueue()
        slots: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(self.window):
            slots.put(None)
        stop = threading.Event()

        feeder = threading.Thread(target=feed, name="autodice-feed", daemon=True,
                                  args=(frames, self._make, self._post, tickets, slots, stop,
                                        self._recovery is not None))
        feeder.start()
        last = -1
        try:
            while True:
                ticket = tickets.get()
                kind = ticket[0]
                if kind == "end":
                    return
                if kind == "raise":
                    raise ticket[1]
                if kind == "error":
                    self._figures.failed += 1
                    yield ticket[1]
                    continue
                if kind == "gone":
                    self._fail(last)
                sent, result = self._next_result(last)
                slots.put(None)
                self._figures.delivered_one(sent.at, first=last < 0)
                last = sent.index
                yield self._read(sent, result)
        except BaseException:
            # The caller stopped early (a break, its own error, Ctrl-C): take the results of the
            # frames already sent, so the session is in step for the next map. One that cannot
            # is abandoned; the caller's exception is still the one raised.
            stop.set()
            if self._broken is None:
                feeder.join()  # it posts no frame after this: what is in flight is all there is
                try:
                    self._drain(last)
                except Exception:  # noqa: BLE001, S110 - _drain closed it; the next call says
                    pass
            raise
        finally:
            stop.set()
            # A feeder inside the caller's iterable (a camera that blocks) ends on its next frame.
            feeder.join(timeout=None if self._broken is None else 1.0)

    def _drain(self, last: int) -> None:
        """The caller stopped early (its feeder ended): take the results of the frames still in
        flight, so the stream is in step for the next map; a session that cannot is closed."""
        try:
            while True:
                with self._sending:
                    if not self._inflight:
                        return
                self._next_result(last)
        except BaseException:
            self._abandon()
            raise

    def _next_result(self, last: int) -> tuple[Sent, object]:
        """The oldest frame in flight and its result; a job that dies on the way is restarted
        (with recovery) and the frames in flight sent again."""
        if self._move is not None:
            self._moved(last)
        while True:
            self._gw.wait_for_result()  # here a stop comes at once: nothing is taken yet
            with stops_held():  # a result taken and counted as one step (core/stops.py)
                try:
                    result = self._gw.result()
                except Gone:
                    result = Gone
                else:
                    with self._sending:
                        sent = self._inflight.popleft()
            if result is Gone:
                self._lost(last)  # a recovery takes long: a stop must reach it
                continue
            self._figures.recovered()
            return sent, result

    def _lost(self, last: int) -> None:
        """The job died mid-stream: restart it through the recovery, or end the session."""
        if self._recovery is None:
            self._fail(last)
        t0 = time.monotonic()
        pause = self._pause()
        try:
            restart = self._recovery.recover(self._gw.job)
        except AutodiceError as e:
            self._fail(last, e.problems)
        except BaseException:  # Ctrl-C while recovering: nothing left running
            self._broken = SessionError(last, "the session was interrupted while recovering")
            self._resume()
            self._abandon(keep=True)
            raise
        self._restart(restart, t0, last, pause)

    def _moved(self, last: int) -> None:
        """rebalance(): its job started, the frames in flight sent to it again."""
        restart, self._move = self._move, None
        t0 = time.monotonic()
        self._restart(restart, t0, last, self._pause())

    def _pause(self) -> int:
        """No frame goes out until :meth:`_resume`; our end of the job's stream is closed.
        Returns this pause's number."""
        with self._sending:
            self._paused = True
            self._pauses += 1
            pause = self._pauses
        self._hang_up()
        return pause

    def _resume(self, pause: int | None = None) -> None:
        """Frames go out again, unless ``pause`` is not the latest: a job that died while
        frames were sent to it again is being restarted once more, and its own replay, with
        the feeder held back, must not meet a feeder in the new job's slots (None: the session
        ends, let any feeder go)."""
        with self._sending:
            if pause is None or pause == self._pauses:
                self._paused = False
                self._sending.notify_all()

    def _restart(self, restart: Restart, t0: float, last: int, pause: int) -> None:
        """Start ``restart``'s job, then send it every frame still in flight, in order (from a
        thread: the gateway returns results while we send), then let the feeder go on."""
        t1 = time.monotonic()
        self._gw.job.stop()  # a recovery stopped it already; a move has not
        try:
            gw = self._start(restart.start, restart.plan)
        except AutodiceError as e:
            self._fail(last, ["the restarted job failed:", *e.problems])
        except BaseException:
            self._broken = SessionError(last, "the session was interrupted while restarting")
            self._resume()
            self._abandon(keep=True)
            raise
        self.plan = restart.plan
        with self._sending:
            self._gw = gw
            again = list(self._inflight)
        self._figures.incident({**restart.incident, "replayed": len(again), "after_frame": last,
                                "restart_s": round(time.monotonic() - t1, 3)}, t0)
        threading.Thread(target=replay, name="autodice-replay", daemon=True,
                         args=(again, lambda parts: self._send(gw, parts),
                               lambda: self._resume(pause))).start()

    def _fail(self, last: int, problems: list[str] | None = None):
        """The job ended mid-stream for good. Say which rank, and what arrived."""
        self._hang_up()
        if problems is None:
            code = self._gw.job.wait(15)
            problems = self._gw.job.failure(code)
        self._broken = SessionError(last, *problems, f"the last frame delivered: {last}"
                                    if last >= 0 else "no frame of this stream was delivered")
        self._resume()  # a feeder waiting on a restart finds the socket closed and ends
        self._abandon(keep=True)
        raise self._broken

    def _check_open(self) -> None:
        if self._broken is not None:
            raise self._broken
        if not self._open:
            raise AutodiceError("this session is closed")

    def stats(self) -> dict:
        """Frames delivered, frames/s and ``steady_fps`` (after each stream's first result),
        end-to-end latency (p50/p90/p99, seconds) and, once closed, the job's own figures per
        rank (``ranks``: compute and wait seconds, bytes, peak memory) with each rank's share of
        a frame (``ms_per_frame``). ``frames_via``: how the last job took frames ("shared
        memory" from this machine, else "socket")."""
        return self._figures.stats(self.window, self._frames_via, self._recovery is not None,
                                   self._job_stats)

    def note_dropped(self, dropped: int | None) -> None:
        """How many frames the live source feeding this session has dropped so far."""
        self._figures.dropped = dropped or 0

    def serve_metrics(self, address: str) -> str:
        """Prometheus metrics at ``address`` until closed (:mod:`.metrics`); where served."""
        self._metrics = Metrics(address, self._figures, lambda: len(self._inflight),
                                lambda: (self.plan, self._gw.live if self._gw else {}))
        return self._metrics.address

    def close(self) -> None:
        """Stop the stream: the ranks finish, report and exit; nothing is left running."""
        if not self._open:
            return
        try:
            if self._broken is None:
                try:
                    self._job_stats = self._gw.finish()
                except OSError:  # the job ended while the session was idle
                    self._fail(-1)
                code = self._gw.job.wait(60)
                if code not in (0, None):
                    self._abandon(keep=True)
                    raise JobError(*self._gw.job.failure(code))
        finally:
            self._abandon()

    @property
    def _open(self) -> bool:
        return self._gw is not None and not self._gw.closed

    def _hang_up(self) -> None:
        """Close our end of the stream (the job goes on until it sees that, or is stopped)."""
        if self._gw is not None:
            self._gw.hang_up()

    def _abandon(self, keep: bool = False) -> None:
        """Close the socket, stop the job if it still runs and remove the session's folder; the
        job's log too, unless ``keep`` (a failure: the error names it)."""
        self._hang_up()
        self._figures.close()
        try:
            if self._gw is not None:
                self._gw.job.stop()
        finally:
            if self._recovery is not None:
                self._recovery.close()
            if self._metrics is not None:
                self._metrics.close()
            shutil.rmtree(self._tmp, ignore_errors=True)
            if self._gw is not None and not keep and not self._kept:
                self._gw.job.log.unlink(missing_ok=True)
            self._kept = self._kept or keep

    def __enter__(self) -> Session:
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.close()
        else:  # an error or Ctrl-C: no waiting on a clean stop
            if self._open and self._broken is None:
                try:
                    self.close()
                    return
                except Exception:  # noqa: BLE001 - the caller's error is the one to see
                    pass
            self._abandon()

