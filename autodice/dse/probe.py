"""``profile_layers``, the C++ probe the profiler measures with (built by
:mod:`autodice.backend.tools`), run under mpirun in its three modes: per-layer times, the
shared-memory link, the co-run slowdown.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np

from ..backend.engine import mpi_prefix
from ..core.errors import AutodiceError
from .profile import Corun, link_from_rows, six_digits


def _env() -> dict:
    # As `autodice run` runs the program: passive OpenMP waits unless the user chose otherwise.
    return dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def _with_progress(cmd: list[str], on_progress) -> tuple[int, list[str]]:
    """Run ``cmd``, passing its ``progress DONE TOTAL`` stderr lines to ``on_progress``;
    returns the exit code and everything else it said (stdout and stderr)."""
    proc = subprocess.Popen(cmd, stderr=subprocess.STDOUT, stdout=subprocess.PIPE, text=True,
                            env=_env())
    said = []
    assert proc.stdout is not None
    for line in proc.stdout:
        parts = line.split()
        if len(parts) == 3 and parts[0] == "progress":
            on_progress(int(parts[1]), int(parts[2]))
        else:
            said.append(line.rstrip())
    return proc.wait(), said


def run_profiler(binary: Path, param: Path, feeds: list[Path], threads: tuple[int, ...],
                 warmup: int, runs: int, out: Path, on_progress, model: str = "model",
                 gpu: int | None = None) -> dict:
    """Run profile_layers; returns its JSON (fingerprints and raw times of every run; with
    ``gpu``, the Vulkan device's runs under "gpu" and its copy times too)."""
    cmd = [str(binary), str(param), str(param.with_suffix(".bin")), str(out),
           "--threads", ",".join(map(str, threads)), "--warmup", str(warmup),
           "--runs", str(runs), *(["--gpu", str(gpu)] if gpu is not None else [])]
    for p in feeds:
        cmd += ["--input", str(p)]
    code, said = _with_progress(cmd, on_progress)
    if code != 0 or not out.exists():
        missing = [ln.split("layer ", 1)[1].split()[0] for ln in said
                   if "not exists or registered" in ln]
        if missing:
            raise AutodiceError(f"{model}: ncnn cannot load the net pnnx made of it: it has no "
                                f"{', '.join(missing)} layer (pnnx did not lower that ONNX op)")
        raise AutodiceError(f"profile_layers failed (exit {code}):", *said[-6:])
    return json.loads(out.read_text())


def measure_shm(binary: Path, work: Path) -> dict:
    """Bandwidth and latency between two ranks on this host (and the fit's warning, if any),
    fitted to the fastest one-way times of ``profile_layers --link`` (autodice::Transfer, the
    generated program's path)."""
    out = work / "link.json"
    cmd = [str(mpi_prefix() / "bin" / "mpirun"), "-np", "2", "--oversubscribe", "--bind-to",
           "none", str(binary), "--link", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300,
                          check=False)
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stderr + proc.stdout).strip().splitlines()[-6:]
        raise AutodiceError(f"profile_layers --link failed (exit {proc.returncode}):", *tail)
    link, warning = link_from_rows(json.loads(out.read_text())["rows"])
    return {"bandwidth": link.bandwidth, "latency": link.latency, "warning": warning}


def measure_corun(binary: Path, param: Path, feeds: list[Path], warmup: int, runs: int,
                  work: Path, on_progress) -> tuple[Corun | None, int]:
    """How much longer the whole model takes on one core while every core of this machine runs
    it (None on a one-core machine), and the peak resident bytes of a rank that ran it: one
    rank per core, ``profile_layers --corun``.

    Per-layer times are taken with the rest of the machine idle, but a pipelined stage runs while
    its neighbours on the same board work too, and they share caches and memory bandwidth
    (ResNet-50's halves ran ~15 % slower than alone on this project's 2-core VM). The cost model
    stretches a rank's compute by this factor, scaled by how busy its board's other cores are.
    """
    cores = os.cpu_count() or 1
    out = work / "corun.json"
    cmd = [str(mpi_prefix() / "bin" / "mpirun"), "-np", str(cores), "--bind-to", "core",
           "--map-by", "core", str(binary), str(param), str(param.with_suffix(".bin")), str(out),
           "--corun", "--warmup", str(warmup), "--runs", str(runs)]
    for f in feeds:
        cmd += ["--input", str(f)]
    code, said = _with_progress(cmd, on_progress)
    if code != 0 or not out.exists():
        raise AutodiceError(f"profile_layers --corun failed (exit {code}):", *said[-6:])
    raw = json.loads(out.read_text())
    slowdown = np.median(raw["together_ms"]) / np.median(raw["alone_ms"])
    return (Corun(cores, six_digits(slowdown)) if cores > 1 else None), int(raw["peak_rss"])
