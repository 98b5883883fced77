"""autodice's C++ tools on the hosts of an inventory, and ``profile_layers`` run on one of them.

Getting the tools there is ``autodice deploy``'s machinery, reused as it is: one ssh master
connection per host, the same prerequisite check, rsync by content, one build per architecture
and shared filesystem (cross-built here for a board of another architecture when the cross
compiler is installed, as deploy does; ncnn built on a host that has none). The "tools package"
(profile_layers.cpp, the runtime and the profiler's CMakeLists.txt) lives in
``<remote_dir>/tools``, apart from a deployed program, so neither rebuilds the other.

:func:`on_host` is what ``autodice profile --on HOST`` measures with: a board's per-layer times,
its shared-memory link and its co-run slowdown, taken by the same tool as on this machine
(:class:`~.probe.Machine`), built for the board.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..backend.tools import write_sources
from ..core.errors import AutodiceError
from ..deploy.head_build import choose
from ..deploy.host_check import check_all
from ..deploy.inventory import Inventory, load_inventory
from ..deploy.remote_build import build_all
from ..deploy.ssh import Build, Host, Progress, Ssh, must
from ..deploy.sync import sync_all
from .probe import RUN_AS_ROOT, with_progress

TOOLS = Build(folder="tools", exe="profile_layers")
TOOLS_FOLDERS = ("package", "build", "launch", "results", "job")  # inside <remote_dir>/tools


def ship_tools(ssh: Ssh, hosts: list[Host], work: Path, progress: Progress) -> None:
    """Check, send and build the tools on ``hosts`` (each ends with ``TOOLS.binary(h)``).

    Raises:
        AutodiceError: unreachable hosts or missing tools (all at once), a host that can
            neither build nor be cross-built for, a failed build (its log tail).
    """
    sources = write_sources(work / "tools")
    check_all(ssh, hosts, progress, TOOLS)  # + connect
    choose(hosts)
    sync_all(ssh, hosts, lambda _: work / "tools", progress, TOOLS, TOOLS_FOLDERS)
    build_all(ssh, hosts, sources, work / "bin", progress, TOOLS,
              package=lambda _: work / "tools")


class OnHost:
    """profile_layers on host ``h`` (the tools shipped there), as a :class:`~.probe.Machine`:
    files go to ``<tools>/job``, results come from ``<tools>/results``."""

    def __init__(self, ssh: Ssh, h: Host):
        self.ssh, self.h = ssh, h
        root = TOOLS.root(h)
        self.tool = TOOLS.binary(h)
        prefix = h.target.mpi_prefix
        self.mpirun = f"{prefix}/bin/mpirun" if prefix else "mpirun"
        self.cores = h.cpus
        self.job, self.results = f"{root}/job", f"{root}/results"
        # The tool's checksum stands for its sources, ncnn and compiler: a rebuild is a new key.
        self.key = f"{h.target.host} {h.arch} {h.program}"

    def place(self, files: list[Path]) -> list[str]:
        must(["rsync", "-c", "-e", self.ssh.rsh(), *map(str, files),
              f"{self.h.target.host}:{self.job}/"], f"{self.h.target.where()}: sending the "
             "model to profile failed", timeout=600)
        return [f"{self.job}/{f.name}" for f in files]

    def out(self, name: str) -> str:
        path = f"{self.results}/{name}"
        must(self.ssh.cmd(self.h.target, "rm", "-f", path),
             f"{self.h.target.where()}: cannot clear {path}")
        return path

    def run(self, cmd: list[str], on_progress) -> tuple[int, list[str]]:
        env = [f"{k}={v}" for k, v in RUN_AS_ROOT.items()]
        code, said = with_progress(self.ssh.cmd(self.h.target, "env", *env, *cmd), on_progress,
                                   None)
        if code == 255:
            raise AutodiceError(f"{self.h.target.where()}: the connection was lost:",
                                *said[-3:])
        return code, said

    def read(self, path: str) -> str | None:
        proc = subprocess.run(self.ssh.cmd(self.h.target, "cat", path), capture_output=True,
                              text=True, timeout=120)
        return proc.stdout if proc.returncode == 0 else None

    def info(self) -> dict:
        proc = subprocess.run(self.ssh.script(
            self.h.target, "sed -n 's/^model name[^:]*: *//p; s/^Model[^:]*: *//p' "
            "/proc/cpuinfo | head -n 1"), capture_output=True, text=True, timeout=60)
        return {"arch": self.h.arch, "cpu": proc.stdout.strip() or "unknown",
                "cores": self.cores}


def host_inventory(inventory: str | Path | Inventory, host: str) -> Inventory:
    """The inventory of ``host`` alone.

    Raises:
        AutodiceError: the inventory does not name ``host`` (or cannot be read).
    """
    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    if host not in inv.targets:
        raise AutodiceError(f"--on {host}: {inv.path} has no such host "
                            f"(hosts: {', '.join(inv.targets)})")
    return Inventory(inv.path, inv.network, {host: inv.targets[host]})


@contextlib.contextmanager
def on_host(inventory: str | Path | Inventory, host: str, console=None) -> Iterator[OnHost]:
    """The tools shipped to ``host`` of the inventory (built for it), ready to measure with.

    Raises:
        AutodiceError: a host the inventory does not name (before any network use), and what
            :func:`ship_tools` raises.
    """
    from rich.console import Console
    from rich.progress import Progress as Bar
    from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

    one = host_inventory(inventory, host)
    console = console or Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="autodice-on-") as tmp:
        work = Path(tmp)
        h = Host(one.targets[host])
        ssh = Ssh(one, work)
        try:
            with Bar(SpinnerColumn(), TextColumn("{task.fields[host]:<12}"),
                     TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                     transient=True) as bar:
                task = bar.add_task("connecting", host=host, total=None)
                ship_tools(ssh, [h], work, lambda _, step: bar.update(task, description=step))
            yield OnHost(ssh, h)
        finally:
            ssh.close(one.targets.values())
