"""Sessions on deployed hosts: ``autodice.open(out, inventory=...)``, ``deploy --run --input DIR``.

The job is deploy's own (:func:`~autodice.deploy.deploy.ship`: check, sync, build; then mpirun on
the head with one app context per rank) plus the session's gateway as one rank more on the head
(:mod:`autodice.backend.session`). The gateway connects to a Unix socket on the head that is
ssh's remote forward (``ssh -R``) of the session's socket here, carried by the same ssh
connection that runs mpirun: frames travel encrypted, through no port anyone must open, and the
forward ends with the job (:mod:`.remote_job`). Between the ranks, frames move over MPI as in
any run. With ``recover``, a lost host is left out and the stream goes on (:mod:`.recover`).
Each board's sensors are read over ssh while the session runs (:mod:`.board_figures`).
"""

from __future__ import annotations

from pathlib import Path

from ..backend.session import Session, check_window
from .board_figures import BoardWatch
from .deploy import ship
from .launch import check_launchable
from .remote_job import RemoteJob
from .ssh import KEEP_S, Progress


def open_deployed(out_dir: str | Path, inventory: str | Path, window: int | None = None,
                  gpu_fallback: bool = False, progress: Progress | None = None,
                  keep_connections_s: float = KEEP_S, recover: bool | str | Path = False,
                  ahead: bool = True) -> Session:
    """Deploy ``out_dir`` to the inventory's hosts (only what changed moves) and start a session
    there: every rank on its host, frames streamed from here.

    Args:
        recover: when a host is lost, go on without it (:mod:`.recover`); a path: a ``dse``
            output folder whose fastest point on the hosts left is the new mapping.
        ahead: with ``recover``, prepare and ship a fallback for each host's loss while the
            stream runs.
    Raises:
        AutodiceError: as ``deploy`` (before anything runs), or the job failed to start (the
            rank and host named).
    """
    check_window(window)
    front = Path(recover) if isinstance(recover, (str, Path)) else None
    if front is not None:
        from .recover import read_front

        read_front(front)
    shipped = ship(out_dir, inventory, progress, keep_connections_s,
                   lambda plan, inv: check_launchable(inv))
    if progress is not None:
        progress(shipped.hosts[0].target.host, "starting the job")
    recovery = None
    try:
        if recover:
            from .recover import DeployedRecovery

            recovery = DeployedRecovery(shipped, gpu_fallback, front, ahead, progress)
        return Session(shipped.plan, lambda path: RemoteJob(shipped, path, gpu_fallback), window,
                       recovery=recovery, boards=BoardWatch(shipped.ssh, shipped.hosts))
    except BaseException:
        shipped.close()
        if recovery is not None:
            recovery.close()
        raise
