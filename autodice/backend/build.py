"""``autodice build``: compile each architecture's program once (packages share the source)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ..core.errors import AutodiceError
from ..core.outdir import claim
from ..core.plan import load_plan
from .engine import cmake_args, ensure_ncnn


def run_logged(cmd: list[str], log: Path, what: str) -> None:
    """Run ``cmd`` with its output appended to ``log``; a failure names the log and its tail."""
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise AutodiceError(f"{what} failed (log: {log}):", *tail)


def build(out_dir: str | Path, console=None) -> Path:
    """Configure and build ``out_dir/packages``; each package's ``build/program`` links to it.

    Returns:
        The program built for this machine.
    Raises:
        AutodiceError: no packages (run gen), no ncnn/MPI, or a failed compile (with its log tail).
    """
    out_dir = Path(out_dir)
    plan = load_plan(out_dir)
    packages = out_dir / "packages"
    if not (packages / plan.ranks[0].host / "program.cpp").exists():
        raise AutodiceError(f"{packages}: no packages; run `autodice gen {out_dir}` first")
    claim(out_dir, "build/")
    ncnn = ensure_ncnn(console=console)
    # Built here, the program runs here, whatever the platform says the hosts are: one build
    # serves every package (a board builds its own natively through `autodice deploy`).
    bdir = out_dir / "build" / "local"
    bdir.mkdir(parents=True, exist_ok=True)
    log = bdir / "build.log"
    log.write_text("")
    run_logged(["cmake", "-S", str(packages / plan.hosts()[0]), "-B", str(bdir),
          "-DCMAKE_BUILD_TYPE=Release", *cmake_args(ncnn)], log, "configuring")
    run_logged(["cmake", "--build", str(bdir), "-j", str(os.cpu_count() or 2)], log, "compiling")
    program = bdir / "program"
    for host in plan.hosts():
        (packages / host / "build").mkdir(exist_ok=True)
        link = packages / host / "build" / "program"
        link.unlink(missing_ok=True)
        link.symlink_to(os.path.relpath(program, link.parent))
    return program
