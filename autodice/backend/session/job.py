"""What a session drives, and who starts it: the contract between a session and its launchers.

How a job is started and stopped is the launcher's business: every rank here under mpirun
(:class:`~autodice.backend.run.LocalJob`), or on deployed hosts
(:class:`~autodice.deploy.remote_job.RemoteJob`). So is what to do when it dies: a session given a
:class:`Recovery` asks it for the next job (on deployed hosts, a mapping onto the hosts left:
``autodice.deploy.recover``) and starts that.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ...core.errors import JobError
from ...core.plan import Plan
from ..engine import cache_root

LOGS_KEPT = 20  # failed jobs' logs kept in the cache, newest first


def job_log() -> Path:
    """A new file for a session job's output, in the cache's ``logs/`` (a session's own folder
    goes with it, whatever its end): a failed job's log outlives its session for the error that
    names it; the oldest beyond :data:`LOGS_KEPT` are removed."""
    folder = cache_root() / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    for old in sorted(folder.glob("job-*.log"), key=lambda p: p.stat().st_mtime)[:-LOGS_KEPT]:
        old.unlink(missing_ok=True)
    fd, path = tempfile.mkstemp(prefix=f"job-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".log",
                                dir=folder)
    os.close(fd)
    return Path(path)


class Job(Protocol):
    """A started job: mpirun here, or on a head node over ssh."""

    log: Path  # what mpirun (or the ssh that runs it) said

    def poll(self) -> int | None: ...  # exit code once it ended
    def wait(self, timeout: float) -> int | None: ...  # None if still running then
    def stop(self) -> None: ...  # end it now; nothing of it left running anywhere
    def failure(self, code: int | None) -> list[str]: ...  # what brought it down, one line each


@dataclass
class Restart:
    """The next job after the last one died (or a planned move): its plan, how to start it
    (given the socket's path its gateway connects to), and what the recovery did, for the
    session's ``stats()`` (``incidents``)."""

    plan: Plan
    start: Callable[[str], Job]
    incident: dict = field(default_factory=dict)


class Recovery(Protocol):
    """What a session asks when its job dies, or when the caller asks to rebalance."""

    def recover(self, job: Job) -> Restart: ...  # the dead job: stop it, find what was lost
    def rebalance(self) -> Restart | None: ...  # the job for all hosts, ready; None: no move
    def close(self) -> None: ...  # the session ended: nothing of the recovery's left running


class SessionError(JobError):
    """The job ended under the session. ``delivered``: the index (in the current ``map``) of the
    last frame whose result was handed out, -1 if none: resend the frames after it."""

    def __init__(self, delivered: int, *problems: str):
        super().__init__(*problems)
        self.delivered = delivered


def session_folder() -> Path:
    """A new folder for a session's socket and launch files (:func:`own_folder`)."""
    return own_folder(Path(tempfile.gettempdir()), "session")


def own_folder(parent: Path, kind: str) -> Path:
    """A new folder ``autodice-KIND-PID-...`` in ``parent``, named after this process; those of
    processes that died without removing theirs (SIGKILL) are removed first.

    Raises:
        OSError: ``parent`` cannot hold it.
    """
    for stale in parent.glob(f"autodice-{kind}-*-*"):
        pid = stale.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(stale, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"autodice-{kind}-{os.getpid()}-", dir=parent))
