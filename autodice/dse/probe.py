"""``profile_layers``, the C++ probe the profiler measures with: its sources, its build (cached
per source hash, ncnn and MPI), and its three modes run under mpirun (per-layer times, the
shared-memory link, the co-run slowdown). The link probe on cluster hosts (:mod:`.links`) builds
the same sources there.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

import numpy as np

from ..backend.engine import cache_root, cmake_args, mpi_prefix
from ..core.errors import AutodiceError
from .profile import Corun, link_from_rows, six_digits

SOURCES = ("profile_layers.cpp", "autodice_runtime.cpp", "autodice_runtime.h")


def source_digest() -> str:
    """Hash of the C++ sources the profiler builds from (a change rebuilds and re-measures)."""
    root = resources.files("autodice.runtime_cpp")
    h = hashlib.sha256()
    for name in SOURCES:
        h.update(name.encode() + b"\0" + root.joinpath(name).read_bytes())
    return h.hexdigest()


def write_sources(folder: Path) -> str:
    """Write the profiler's sources and its CMakeLists.txt into ``folder`` (here, or as the tools
    package the link probe builds on cluster hosts); returns a hash of what was written."""
    folder.mkdir(parents=True, exist_ok=True)
    root = resources.files("autodice.runtime_cpp")
    files = {name: root.joinpath(name).read_bytes() for name in SOURCES}
    files["CMakeLists.txt"] = _CMAKE.encode()
    digest = hashlib.sha256()
    for name, data in sorted(files.items()):
        (folder / name).write_bytes(data)
        digest.update(name.encode() + b"\0" + data + b"\0")
    return digest.hexdigest()[:16]


def build_tools(ncnn: Path, console) -> Path:
    """``profile_layers``, built once per source hash + ncnn + MPI (it links the runtime)."""
    key = hashlib.sha256(f"{source_digest()}\n{ncnn}\n{mpi_prefix()}".encode()).hexdigest()[:16]
    entry = cache_root() / "profiler" / key
    if (entry / "profile_layers").exists():
        return entry
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=entry.parent))
    try:
        src = tmp / "src"
        write_sources(src)
        log = tmp / "build.log"
        for what, cmd in (("configuring", ["cmake", "-S", str(src), "-B", str(tmp / "build"),
                                           "-DCMAKE_BUILD_TYPE=Release", *cmake_args(ncnn)]),
                          ("compiling", ["cmake", "--build", str(tmp / "build"), "-j",
                                         str(os.cpu_count() or 2)])):
            with open(log, "a") as f:
                proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=False)
            if proc.returncode != 0:
                tail = "\n".join(log.read_text().splitlines()[-15:])
                raise AutodiceError(f"{what} the profiler failed:\n{tail}")
        out = tmp / "bin"
        out.mkdir()
        shutil.copy2(tmp / "build" / "profile_layers", out / "profile_layers")
        try:
            os.rename(out, entry)  # atomic: complete or absent
        except OSError:  # another process built it first
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry


_CMAKE = """\
# Written by autodice.profiler: the per-layer and link profiler.
cmake_minimum_required(VERSION 3.16)
project(autodice_profiler LANGUAGES C CXX)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
find_package(MPI REQUIRED COMPONENTS CXX)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(ncnn REQUIRED)
add_library(autodice_runtime STATIC autodice_runtime.cpp)
target_include_directories(autodice_runtime PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(autodice_runtime PUBLIC ncnn MPI::MPI_CXX OpenMP::OpenMP_CXX)
add_executable(profile_layers profile_layers.cpp)
target_link_libraries(profile_layers PRIVATE autodice_runtime)
target_compile_options(profile_layers PRIVATE -Wall -Wextra -Werror)
"""


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
                 warmup: int, runs: int, out: Path, on_progress, model: str = "model") -> dict:
    """Run profile_layers; returns its JSON (fingerprints and raw times of every run)."""
    cmd = [str(binary), str(param), str(param.with_suffix(".bin")), str(out),
           "--threads", ",".join(map(str, threads)), "--warmup", str(warmup),
           "--runs", str(runs)]
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
