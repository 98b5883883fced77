"""``autodice deploy``: ship each host's package over ssh, build it there, run mpirun across hosts.

Steps, each over all hosts at once (one thread per host), each finished by every host before the
next starts (but for the build, which overlaps the sync), so a broken host stops the deploy
before anything runs anywhere:

1. ``connect`` + ``check`` (:mod:`.host_check`): one ssh master connection per host, reused from
   an earlier deploy when one is still open (all later ssh and rsync go through it: no new
   handshakes), and in one remote shell: architecture, cores, tools (compiler, cmake, rsync,
   MPI, ncnn) and what an earlier deploy left there. Every failing host is reported at once.
2. ``sync`` (:mod:`.sync`): rsync the package into ``<remote_dir>/package`` by content (``-c``,
   no times), so only changed files move and unchanged sources keep their remote mtimes (make
   rebuilds nothing it need not); a host whose package is already there (its sync stamp, as
   the check read it) is not touched. Bytes sent per host come from ``rsync --stats``.
3. ``build`` (:mod:`.remote_build`): boards of another architecture than this machine's get
   their program cross-built here once per architecture (:mod:`.head_build`) and receive it;
   a host that is not what the platform file says stops the deploy first. Other hosts that
   share an architecture (``uname -m``) and a filesystem label (and MPI and ncnn prefixes)
   build once, on the first of them, as soon as its own package is there (while the others
   still sync); the others receive the binary by rsync. Hosts without a shared filesystem
   build their own. A build runs only when the sources or flags differ from the last one that
   succeeded there (a stamp it leaves), a copy only when the binaries differ. A host with no
   ncnn builds the pinned ncnn once in its remote directory.
4. ``run`` (``--run``, :mod:`.launch`): the real-address hostfile, rankfile and an ssh config go
   to the head node (the host of rank 0; only when they changed), which starts ``mpirun`` with
   Open MPI's ssh launcher; one MPMD app context per rank gives each its own host's directory.
   Outputs and ``stats.json`` come back into ``OUT/results/``. Whatever happens, no rank of
   ours is left running on any host.

Steps 1-3 are :func:`ship`; a session on the hosts (:mod:`.stream`) ships the same way, then
runs its own job.

So a redeploy costs one remote shell per host plus one rsync per host whose package changed
(and the build where the program changed); the master connections stay open for
``keep_connections_s`` idle seconds after a deploy, for the next one.

How deploy reaches the hosts (ssh and rsync over shared connections, one step on every host at
once) is :mod:`.ssh`.

Nothing here builds a shell string from spec values: local commands are argument lists; the one
remote shell per ssh call gets constant scripts whose values arrive as quoted positional
arguments, and every remote path is a fixed name inside the inventory's (validated) remote_dir.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..backend.build import RUNTIME_FILES, files_digest
from ..backend.run import RunResult, check_inputs, program_flags, stage_inputs
from ..core.errors import AutodiceError
from ..core.outdir import claim
from ..core.plan import Plan, load_plan
from ..core.spec import Device, parse_platform
from .head_build import choose
from .host_check import check_all
from .inventory import Inventory, load_inventory
from .launch import check_launchable, run_job, write_launch_files
from .remote_build import build_all, package_digest
from .ssh import KEEP_S, Host, Progress, Ssh
from .sync import Digests, sync_package


@dataclass(frozen=True)
class HostReport:
    """What deploy did on one host."""

    host: str
    arch: str  # uname -m
    cpus: int
    bytes_sent: int  # rsync's "Total bytes sent" for the package (data + protocol)
    literal_bytes: int  # file data that actually moved
    files: tuple[str, ...]  # package files that moved
    built: bool  # builds here; False: receives the binary built on ``built_by``
    built_by: str
    compiled: bool  # this deploy compiled (sources or flags changed, or no binary yet)


@dataclass(frozen=True)
class DeployResult:
    hosts: dict[str, HostReport]
    seconds: dict[str, float]  # per step, wall time; "build": what it took after the last sync
    run: RunResult | None = None


@dataclass
class Shipped:
    """What :func:`ship` leaves for a job on the hosts: the plan, the inventory, the live hosts
    (rank 0's first: the head) and the ssh connections to them."""

    out_dir: Path
    plan: Plan
    inv: Inventory
    ssh: Ssh
    hosts: list[Host]
    seconds: dict[str, float]

    @property
    def work(self) -> Path:
        return self.out_dir / "deploy"

    def reports(self) -> dict[str, HostReport]:
        return {h.target.host: HostReport(h.target.host, h.arch, h.cpus, *h.sent,
                                          built=h.builder == h.target.host, built_by=h.builder,
                                          compiled=h.compiled)
                for h in self.hosts}

    def write_report(self) -> None:
        """``deploy/report.json``: per host what moved and where it was built; seconds per step."""
        (self.work / "report.json").write_text(json.dumps(
            {"hosts": {k: {**vars(r), "files": list(r.files)} for k, r in self.reports().items()},
             "seconds": self.seconds}, indent=1, sort_keys=True) + "\n")

    def close(self) -> None:
        """End of the job: the ssh connections close or wait for the next deploy."""
        self.ssh.close(self.inv.targets.values())


def deploy(out_dir: str | Path, inventory: str | Path, run: bool = False,
           inputs: dict[str, Path] | None = None, frames: int = 1, pipeline: bool = True,
           timeout_s: float = 600, progress: Progress | None = None, gpu_fallback: bool = False,
           keep_connections_s: float = KEEP_S) -> DeployResult:
    """Deploy ``out_dir``'s packages to the inventory's hosts; with ``run``, run the job there.

    Args:
        inventory: inventory.toml (see :mod:`autodice.deploy.inventory`).
        inputs: model input name -> .npy, needed with ``run``.
        timeout_s: the longest the job may run before it is stopped.
        progress: called with (host, step) as each host moves on.
        gpu_fallback: GPU ranks on hosts without a Vulkan device compute on the CPU.
        keep_connections_s: how long each host's ssh master connection stays open, idle, for
            the next deploy (0: closed at the end of this one).
    Returns:
        Per host what moved and where it was built; with ``run``, outputs and stats.
    Raises:
        AutodiceError: a bad inventory or input (before any network use), unreachable hosts,
            failed authentication or missing tools (all hosts at once, before anything is
            copied), a failed remote build (its log tail) or a failed run (rank and host named).
    """
    progress = progress or (lambda host, step: None)
    if run and (frames < 1 or not timeout_s > 0):
        raise AutodiceError(f"--frames {frames} --timeout {timeout_s:g}: need at least 1 frame "
                            "and a timeout above 0 s")
    flags = program_flags(frames, pipeline, gpu_fallback)

    def check(plan: Plan, inv: Inventory) -> None:
        if inputs is None:
            raise AutodiceError("deploy --run needs --input")
        check_inputs(plan, inputs)
        check_launchable(inv)

    shipped = ship(out_dir, inventory, progress, keep_connections_s, check if run else None)
    result_run = None
    try:
        if run:
            claim(shipped.out_dir, "results/")
            stage_inputs(shipped.plan, inputs, shipped.work / "inputs")
            result_run = _timed(shipped.seconds, "run", lambda: run_job(
                shipped.ssh, shipped.plan, shipped.inv, shipped.hosts, shipped.out_dir, flags,
                timeout_s, progress))
    finally:
        shipped.close()
    for h in shipped.hosts:
        progress(h.target.host, "done")
    if run:
        shipped.write_report()  # with the run's seconds
    return DeployResult(shipped.reports(), shipped.seconds, result_run)


def ship(out_dir: str | Path, inventory: str | Path | Inventory, progress: Progress | None = None,
         keep_connections_s: float = KEEP_S,
         before: Callable[[Plan, Inventory], None] | None = None) -> Shipped:
    """Steps 1-3 and the launch files: every host holds its package and a built program.

    ``before(plan, inventory)`` runs once the plan and inventory are read and before any
    network use: a job's own checks of its input, so bad input loses nothing. The caller
    closes the result (:meth:`Shipped.close`) once the job is done; on an error here it is
    closed already.

    Raises:
        AutodiceError: as :func:`deploy`.
    """
    out_dir = Path(out_dir)
    progress = progress or (lambda host, step: None)
    plan = load_plan(out_dir)
    hosts_of_plan = plan.hosts()
    problems = []
    missing = [h for h in hosts_of_plan if not (out_dir / "packages" / h / "program.cpp").exists()]
    if missing:
        problems.append(f"{out_dir}/packages: no package for {', '.join(missing)}; "
                        f"run `autodice gen {out_dir}` first")
    try:
        inv = (_covering(inventory, hosts_of_plan) if isinstance(inventory, Inventory)
               else load_inventory(inventory, hosts_of_plan))
    except AutodiceError as e:
        problems += e.problems
    if problems:
        raise AutodiceError(*problems)
    if before is not None:
        before(plan, inv)
    claim(out_dir, "deploy/")
    work = out_dir / "deploy"
    work.mkdir(exist_ok=True)
    hosts = [Host(inv.targets[name]) for name in hosts_of_plan]
    shipped = Shipped(out_dir, plan, inv, Ssh(inv, work, keep_connections_s), hosts, {})
    ssh, seconds = shipped.ssh, shipped.seconds
    try:
        _timed(seconds, "check", lambda: check_all(ssh, hosts, progress))  # + connect
        choose(hosts, _devices(out_dir))
        package = out_dir / "packages" / hosts[0].target.host
        sources = package_digest(package)
        gpu_hosts = frozenset(r.host for r in plan.ranks if r.device == "gpu")
        synced: list[float] = []
        digests = Digests(work / "digests.json")

        def sync(h: Host) -> None:
            sync_package(ssh, h, out_dir / "packages" / h.target.host, digests=digests)
            synced.append(time.monotonic())

        start = time.monotonic()
        build_all(ssh, hosts, sources, work / "bin", progress, gpu_hosts=gpu_hosts, sync=sync,
                  package=lambda h: out_dir / "packages" / h.target.host,
                  runtime=files_digest(package, RUNTIME_FILES))
        seconds["sync"] = round(max(synced) - start, 3)
        seconds["build"] = round(time.monotonic() - max(synced), 3)  # after the last sync
        digests.save()
        write_launch_files(ssh, plan, inv, hosts, work, progress)
    except BaseException:
        shipped.close()
        raise
    shipped.write_report()
    return shipped


def _devices(out_dir: Path) -> dict[str, Device]:
    """The platform file's devices, as split copied it into the output (none if it did not)."""
    path = out_dir / "platform.txt"
    return parse_platform(path).devices if path.is_file() else {}


def _covering(inv: Inventory, hosts: list[str]) -> Inventory:
    """``inv`` if it names every host of the plan (an inventory made in code, e.g. by a
    recovery); else an error naming the hosts it lacks."""
    missing = [h for h in hosts if h not in inv.targets]
    if missing:
        raise AutodiceError(f"{inv.path}: no entry for host {', '.join(missing)}")
    return inv


def _timed(seconds: dict, step: str, fn):
    start = time.monotonic()
    try:
        return fn()
    finally:
        seconds[step] = round(time.monotonic() - start, 3)
