"""The job of a session on deployed hosts: every rank on its host and the gateway on the head,
under mpirun started over ssh, the gateway's stream forwarded back here (:mod:`.stream`).
"""

from __future__ import annotations

import secrets
import subprocess

from ..backend.session.job import job_log
from ..core.errors import AutodiceError
from .deploy import Shipped
from .launch import HeadJob, mpirun_argv
from .rank_exits import rank_deaths, run_failure
from .ssh import must, parallel

_SOCKET_BYTES = 107  # sun_path holds 108 bytes with its terminating zero


class RemoteJob:
    """Every rank on its host and the gateway on the head, under mpirun started over ssh."""

    def __init__(self, shipped: Shipped, local_socket: str, gpu_fallback: bool = False):
        self.shipped = shipped
        head = shipped.hosts[0]
        self.socket = f"{head.dir}/job/stream-{secrets.token_hex(4)}.sock"
        if len(self.socket.encode()) > _SOCKET_BYTES:
            raise AutodiceError(f"{head.target.where()}: remote_dir {head.dir} is too long for "
                                f"a session's socket ({self.socket}: over {_SOCKET_BYTES} "
                                "bytes); choose a shorter one in the inventory")
        self._stopped = False
        self._clear_results()
        ssh, plan = shipped.ssh, shipped.plan
        flags = ["--stream", self.socket] + (["--gpu-fallback", "cpu"] if gpu_fallback else [])
        argv = mpirun_argv(plan, shipped.inv, {h.target.host: h for h in shipped.hosts}, flags,
                           gateway=True)
        self.log = job_log()
        # A connection of its own (not the shared master): the forward lives and dies with it.
        self.job = HeadJob(ssh, shipped.hosts, argv, self.log, ssh_options=(
            "-o", "ControlPath=none", "-o", "ExitOnForwardFailure=yes",
            "-R", f"{self.socket}:{local_socket}"), ranks=len(plan.ranks) + 1)

    def _clear_results(self) -> None:
        """A fresh results folder on every host: a death marker of an earlier job must not
        name a rank of this one."""
        ssh = self.shipped.ssh
        problems = parallel(self.shipped.hosts, "results", lambda h: must(
            ssh.script(h.target, 'rm -rf "$1/results" && mkdir "$1/results"', h.dir),
            "cannot clear the results directory", timeout=60), lambda host, step: None)
        if problems:
            raise AutodiceError(*problems)

    def poll(self) -> int | None:
        return self.job.poll()

    def wait(self, timeout: float) -> int | None:
        return self.job.wait(timeout)

    def stop(self) -> None:
        """End the job (nothing of it left on any host), remove the forward's socket file on
        the head, and let the ssh connections go. Once."""
        if self._stopped:
            return
        self._stopped = True
        try:
            self.job.stop()
            head = self.shipped.hosts[0].target
            subprocess.run(self.shipped.ssh.cmd(head, "rm", "-f", self.socket),
                           capture_output=True, timeout=30)
        finally:
            self.shipped.close()

    def failure(self, code: int | None) -> list[str]:
        """The rank and host that brought the job down (deploy's reading of the evidence)."""
        s = self.shipped
        output = self.log.read_text(errors="replace")
        return run_failure(s.plan, s.inv, output, -1 if code is None else code,
                           self.job.seconds, self.log, rank_deaths(s.ssh, s.hosts))
