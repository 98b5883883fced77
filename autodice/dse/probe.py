"""``profile_layers``, the C++ probe the profiler measures with, run in its three modes: per-layer
times, the shared-memory link, the co-run slowdown — on this machine (:class:`Here`, built by
:mod:`autodice.backend.tools`) or on a host of an inventory (:class:`~.remote_tools.OnHost`).

Both are a :class:`Machine`: where the tool and mpirun are, how many cores there are, how files
get there and results come back. The measurements below are written once against it.
"""

from __future__ import annotations

import json
import os
import platform as host_platform
import subprocess
from pathlib import Path
from typing import Protocol

import numpy as np

from ..backend.engine import mpi_prefix
from ..core.errors import AutodiceError
from ..core.owned import spawn
from .profile import Corun, link_from_rows, six_digits

# mpirun refuses root unless told (the emulated cluster's hosts are reached as root). OpenMP's
# waiting stays as `autodice run` runs the program: the user's choice, else the default.
RUN_AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


class Machine(Protocol):
    """Where profile_layers runs. Paths are the machine's own (strings)."""

    tool: str  # profile_layers
    mpirun: str
    cores: int

    def place(self, files: list[Path]) -> list[str]:
        """Make local ``files`` readable there (one folder, names kept); their paths there."""

    def out(self, name: str) -> str:
        """A path there for a result file ``name``, with no earlier result in it."""

    def run(self, cmd: list[str], on_progress) -> tuple[int, list[str]]:
        """Run ``cmd`` there: its exit code and what it said (``progress D N`` lines go to
        ``on_progress`` instead)."""

    def read(self, path: str) -> str | None:
        """A file's text there; None if it is not there."""

    def info(self) -> dict:
        """profile.json's ``machine``: arch, cpu, cores."""


class Here:
    """profile_layers on this machine, from the tools folder; results go into ``work``."""

    def __init__(self, tools: Path, work: Path):
        self.tool = str(tools / "profile_layers")
        self.mpirun = str(mpi_prefix() / "bin" / "mpirun")
        self.cores = os.cpu_count() or 1
        self.work = work

    def place(self, files: list[Path]) -> list[str]:
        return [str(f) for f in files]

    def out(self, name: str) -> str:
        (self.work / name).unlink(missing_ok=True)
        return str(self.work / name)

    def run(self, cmd: list[str], on_progress) -> tuple[int, list[str]]:
        return with_progress(cmd, on_progress, dict(os.environ, **RUN_AS_ROOT))

    def read(self, path: str) -> str | None:
        try:
            return Path(path).read_text()
        except OSError:
            return None

    def info(self) -> dict:
        cpu = host_platform.processor() or "unknown"
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        return {"arch": host_platform.machine(), "cpu": cpu, "cores": self.cores}


def with_progress(cmd: list[str], on_progress, env: dict | None) -> tuple[int, list[str]]:
    """Run ``cmd``, passing its ``progress DONE TOTAL`` lines to ``on_progress``; returns the
    exit code and everything else it said (stdout and stderr)."""
    proc = spawn(cmd, stderr=subprocess.STDOUT, stdout=subprocess.PIPE, text=True,
                 env=env, stdin=subprocess.DEVNULL)
    said = []
    assert proc.stdout is not None
    for line in proc.stdout:
        parts = line.split()
        if len(parts) == 3 and parts[0] == "progress":
            on_progress(int(parts[1]), int(parts[2]))
        else:
            said.append(line.rstrip())
    return proc.wait(), said


def _ignore(done: int, total: int) -> None:
    pass


def run_profiler(m: Machine, param: Path, feeds: list[Path], threads: tuple[int, ...],
                 warmup: int, runs: int, on_progress, model: str = "model",
                 gpu: int | None = None, gpu_fp32: bool = False,
                 cores: tuple[int, ...] | None = None) -> dict:
    """Run profile_layers; returns its JSON (fingerprints and raw times of every run; with
    ``gpu``, the Vulkan device's runs under "gpu", in fp32 if ``gpu_fp32``, and its copy times
    too; with ``cores``, pinned to those).

    Raises:
        AutodiceError: the tool failed, or ran on other cores than ``cores`` (a cgroup or
            cpuset that holds back some of them).
    """
    there = m.place([param, param.with_suffix(".bin"), *feeds])
    out = m.out("raw.json")
    cmd = [m.tool, there[0], there[1], out, "--threads", ",".join(map(str, threads)),
           "--warmup", str(warmup), "--runs", str(runs),
           *(["--gpu", str(gpu)] if gpu is not None else []),
           *(["--gpu-fp32"] if gpu is not None and gpu_fp32 else []),
           *(["--cores", ",".join(map(str, cores))] if cores else [])]
    for f in there[2:]:
        cmd += ["--input", f]
    code, said = m.run(cmd, on_progress)
    text = m.read(out) if code == 0 else None
    if text is None:
        missing = [ln.split("layer ", 1)[1].split()[0] for ln in said
                   if "not exists or registered" in ln]
        if missing:
            raise AutodiceError(f"{model}: ncnn cannot load the net pnnx made of it: it has no "
                                f"{', '.join(missing)} layer (pnnx did not lower that ONNX op)")
        raise AutodiceError(f"profile_layers failed (exit {code}):", *said[-6:])
    raw = json.loads(text)
    if cores and raw["cores"] != sorted(cores):
        raise AutodiceError(f"profile_layers ran on cores {raw['cores']}, not the "
                            f"{sorted(cores)} it was pinned to: this process may use only "
                            "some of them (a cgroup's cpuset)")
    return raw


def measure_shm(m: Machine) -> dict:
    """Bandwidth and latency between two ranks on the machine (and the fit's warning, if any),
    fitted to the fastest one-way times of ``profile_layers --link`` (autodice::Transfer, the
    generated program's path)."""
    out = m.out("link.json")
    code, said = m.run([m.mpirun, "-np", "2", "--oversubscribe", "--bind-to", "none", m.tool,
                        "--link", out], _ignore)
    text = m.read(out) if code == 0 else None
    if text is None:
        raise AutodiceError(f"profile_layers --link failed (exit {code}):", *said[-6:])
    link, warning = link_from_rows(json.loads(text)["rows"])
    return {"bandwidth": link.bandwidth, "latency": link.latency, "warning": warning}


def measure_corun(m: Machine, param: Path, feeds: list[Path], warmup: int, runs: int,
                  on_progress) -> tuple[Corun | None, int]:
    """How much longer the whole model takes on one core while every core of the machine runs
    it (None on a one-core machine), and the peak resident bytes of a rank that ran it: one
    rank per core, ``profile_layers --corun``.

    Per-layer times are taken with the rest of the machine idle, but a pipelined stage runs while
    its neighbours on the same board work too, and they share caches and memory bandwidth
    (ResNet-50's halves ran ~15 % slower than alone on this project's 2-core VM). The cost model
    stretches a rank's compute by this factor, scaled by how busy its board's other cores are.
    """
    there = m.place([param, param.with_suffix(".bin"), *feeds])
    out = m.out("corun.json")
    cmd = [m.mpirun, "-np", str(m.cores), "--bind-to", "core", "--map-by", "core", m.tool,
           there[0], there[1], out, "--corun", "--warmup", str(warmup), "--runs", str(runs)]
    for f in there[2:]:
        cmd += ["--input", f]
    code, said = m.run(cmd, on_progress)
    text = m.read(out) if code == 0 else None
    if text is None:
        raise AutodiceError(f"profile_layers --corun failed (exit {code}):", *said[-6:])
    raw = json.loads(text)
    slowdown = np.median(raw["together_ms"]) / np.median(raw["alone_ms"])
    return (Corun(m.cores, six_digits(slowdown)) if m.cores > 1 else None), int(raw["peak_rss"])
