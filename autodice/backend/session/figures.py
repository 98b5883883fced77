"""What a session measures as results come back: frames delivered, frames/s, end-to-end latency.

Busy time runs from a stream's first frame sent to its last result delivered, summed over the
session's maps, so the idle time between two ``map`` calls does not dilute frames/s. Steady time
leaves out each stream's first result (the pipeline filling), as the program's ``steady_fps`` does:
the rate a camera's long stream sees. A replayed frame keeps its first send time: its latency
includes the recovery, and each recovery is an incident with its own times. Energy is each
host's, as its sensor reports it (:mod:`autodice.backend.power`): this machine's read as results
come, a deployed board's as its :class:`Boards` fetch it.
"""

from __future__ import annotations

import bisect
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..host_files import HostFiles, here
from ..power import EnergyMeter, find_sensor

# Seconds, the latency histogram's upper bounds (Prometheus' ``le``): a frame on a Pi's
# pipeline takes from a millisecond to seconds.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# The latency percentiles are over the last this many frames: a stream that runs for days keeps
# 8 MB of them (a list of every frame's had grown by 2.6 M floats a day at 30 frames/s).
LATENCY_KEPT = 1_000_000


@dataclass
class HostFigures:
    """A host's sensor files and its energy since the stream's first result."""

    host: str
    files: HostFiles
    energy: EnergyMeter


class Boards(Protocol):
    """Deployed boards' figures, fetched while the session runs
    (:class:`autodice.deploy.board_figures.BoardWatch`)."""

    hosts: list[HostFigures]

    def start(self, frames: Callable[[], int]) -> None:
        """Begin fetching; ``frames`` says how many results were delivered so far."""

    def close(self) -> None:
        """Stop fetching (the figures fetched stay)."""


class Figures:
    def __init__(self, clock=time.perf_counter, energy: EnergyMeter | None = None,
                 boards: Boards | None = None) -> None:
        """``clock``: what sends are timed by (seconds); ``energy``: this machine's sensor, as
        found (:func:`~autodice.backend.power.find_sensor`) unless given; ``boards``: the
        deployed boards', started here and stopped by :meth:`close`."""
        self._clock = clock
        self.energy = energy or EnergyMeter(find_sensor())
        self.local = HostFigures(socket.gethostname(), here(), self.energy)
        self.boards = boards
        self._latency = np.zeros(0)  # the last LATENCY_KEPT frames', a ring (grown as needed)
        self.busy_s = self.steady_s = self._last = 0.0
        self.delivered = self.steady = 0
        self.failed = 0  # frames that could not be sent
        self.dropped = 0  # a live source's frames the pipeline could not take (its reader's)
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)  # the latency histogram, +Inf last
        self.latency_sum = 0.0
        self._incidents: list[dict] = []
        self._since: float | None = None  # monotonic time of the last incident's loss
        if boards is not None:  # last: their first reading may come at once
            boards.start(lambda: self.delivered)

    def hosts(self) -> list[HostFigures]:
        """This machine's figures, then each board's (a board of this machine's name: its)."""
        boards = self.boards.hosts if self.boards is not None else []
        names = {b.host for b in boards}
        return [h for h in [self.local] if h.host not in names] + boards

    def close(self) -> None:
        """Stop fetching the boards' figures."""
        if self.boards is not None:
            self.boards.close()

    def incident(self, record: dict, t0: float) -> None:
        """A restart after a loss at ``t0`` (time.monotonic): ``record`` says what happened; the
        time to the next result is added when it comes (:meth:`recovered`)."""
        self._incidents.append(dict(record))
        self._since = t0

    def recovered(self) -> None:
        """A result came: the last incident's ``first_result_s``, if not yet taken."""
        if self._since is not None:
            self._incidents[-1]["first_result_s"] = round(time.monotonic() - self._since, 3)
            self._since = None

    def incidents(self) -> list[dict]:
        return [dict(i) for i in self._incidents]

    def stats(self, window: int, frames_via: str, recovering: bool, job_stats: dict | None
              ) -> dict:
        """:meth:`~autodice.backend.session.Session.stats`, from these figures."""
        out = {**self.summary(), "window": window, "frames_via": frames_via,
               # frames per latency bucket, one more count than bounds: those past the last
               "latency_histogram": {"le": list(LATENCY_BUCKETS), "counts": list(self.buckets)},
               "energy": {h.host: h.energy.report() for h in self.hosts()}}
        if recovering:
            out["incidents"] = self.incidents()
        if job_stats:
            out["ranks"] = per_frame(job_stats)
        return out

    def delivered_one(self, sent: float, first: bool) -> None:
        """A result handed out, of a frame sent at ``sent`` (on the clock); ``first``: the
        first of its stream (busy time starts at its send, else at the last result)."""
        now = self._clock()
        self.busy_s += now - (sent if first else self._last)
        if not first:
            self.steady_s += now - self._last
            self.steady += 1
        self._last = now
        self.delivered += 1
        at = (self.delivered - 1) % LATENCY_KEPT
        if at >= len(self._latency):  # grown by doubling up to LATENCY_KEPT
            self._latency = np.resize(self._latency, min(LATENCY_KEPT, max(1024, 2 * at)))
        self._latency[at] = now - sent
        self.buckets[bisect.bisect_left(LATENCY_BUCKETS, now - sent)] += 1
        self.latency_sum += now - sent
        self.energy.sample(self.delivered)

    def summary(self) -> dict:
        """frames, seconds, fps, steady_fps (None before a stream's second result) and
        latency_s (p50/p90/p99/mean, over the last LATENCY_KEPT frames)."""
        lat = self._latency[:min(self.delivered, LATENCY_KEPT)] if self.delivered else np.zeros(1)
        seconds = self.busy_s
        return {"frames": self.delivered, "seconds": seconds,
                "fps": self.delivered / seconds if seconds > 0 else 0.0,
                "steady_fps": self.steady / self.steady_s if self.steady_s > 0 else None,
                "latency_s": {"p50": float(np.percentile(lat, 50)),
                              "p90": float(np.percentile(lat, 90)),
                              "p99": float(np.percentile(lat, 99)),
                              "mean": float(lat.mean())}}


def per_frame(job_stats: dict) -> list[dict]:
    """The ranks' own figures (compute and wait seconds, bytes, peak memory, as the program
    reports them at the end), each with its share of a frame in ms (``ms_per_frame``).
    ``frame_wait``: in a stream, waiting for the gateway's word of the next frame (the
    application's pauses included; a first stage that waits here is short of frames)."""
    ranks = []
    for r in job_stats["ranks"]:
        n = max(1, r["frames"])
        ranks.append({**r, "ms_per_frame": {
            "compute": 1e3 * r["compute_s"] / n, "recv_wait": 1e3 * r["recv_wait_s"] / n,
            "send_wait": 1e3 * r["send_wait_s"] / n,
            # A program built before streams timed it has none.
            "frame_wait": 1e3 * r.get("frame_wait_s", 0.0) / n}})
    return ranks
