"""What a session drives, and who starts it: the contract between a session and its launchers.

How a job is started and stopped is the launcher's business: every rank here under mpirun
(:class:`~autodice.backend.run.LocalJob`), or on deployed hosts
(:class:`~autodice.deploy.remote_job.RemoteJob`). So is what to do when it dies: a session given a
:class:`Recovery` asks it for the next job (on deployed hosts, a mapping onto the hosts left:
``autodice.deploy.recover``) and starts that.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ..core.errors import AutodiceError
from ..core.plan import Plan


class Job(Protocol):
    """A started job: mpirun here, or on a head node over ssh."""

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


class SessionError(AutodiceError):
    """The job ended under the session. ``delivered``: the index (in the current ``map``) of the
    last frame whose result was handed out, -1 if none: resend the frames after it."""

    def __init__(self, delivered: int, *problems: str):
        super().__init__(*problems)
        self.delivered = delivered
