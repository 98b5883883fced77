"""autodice's own C++ tools, built here against the same ncnn and MPI as the programs:
``profile_layers`` (the profiler's probe: per-layer times, links, co-run slowdown) and
``ncnn_check`` (does ncnn load a converted sub-model, and compute what onnxruntime does?) and
``ncnn_int8`` (where each layer's weights lie, and the calibration statistics int8 needs).
The link probe builds the same sources on cluster hosts.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

from ..core.errors import AutodiceError
from .engine import cache_root, cmake_args, mpi_prefix

SOURCES = ("profile_layers.cpp", "profile_gpu.cpp", "profile_gpu.h", "ncnn_check.cpp",
           "ncnn_int8.cpp", "autodice_runtime.cpp", "autodice_tensors.cpp", "autodice_runtime.h",
           "autodice_types.h")
TOOLS = ("profile_layers", "ncnn_check", "ncnn_int8")


def tools_digest() -> str:
    """Hash of the tools' C++ sources (a change rebuilds them, and re-measures profiles)."""
    root = resources.files("autodice.runtime_cpp")
    h = hashlib.sha256()
    for name in SOURCES:
        h.update(name.encode() + b"\0" + root.joinpath(name).read_bytes())
    return h.hexdigest()


def write_sources(folder: Path) -> str:
    """Write the tools' sources and their CMakeLists.txt into ``folder`` (here, or as the tools
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


def build_tools(ncnn: Path) -> Path:
    """The folder holding the built tools, built once per source hash + ncnn + MPI (they link the
    runtime); the folder appears by rename, complete or not at all."""
    key = hashlib.sha256(f"{tools_digest()}\n{ncnn}\n{mpi_prefix()}".encode()).hexdigest()[:16]
    entry = cache_root() / "tools" / key
    if all((entry / t).exists() for t in TOOLS):
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
                tail = log.read_text(errors="replace").splitlines()[-15:]
                raise AutodiceError(f"{what} autodice's C++ tools failed:", *tail)
        out = tmp / "bin"
        out.mkdir()
        for tool in TOOLS:
            shutil.copy2(tmp / "build" / tool, out / tool)
        try:
            os.rename(out, entry)  # atomic: complete or absent
        except OSError:  # another process built it first
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry


_CMAKE = """\
# Written by autodice: the profiler (per-layer times, links), the conversion checker and the
# int8 calibrator.
cmake_minimum_required(VERSION 3.16)
project(autodice_tools LANGUAGES C CXX)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
find_package(MPI REQUIRED COMPONENTS CXX)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(ncnn REQUIRED)
option(AUTODICE_WERROR "treat warnings as errors" OFF)
set(warnings -Wall -Wextra $<$<BOOL:${AUTODICE_WERROR}>:-Werror>)
add_library(autodice_runtime STATIC autodice_runtime.cpp autodice_tensors.cpp)
target_include_directories(autodice_runtime PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(autodice_runtime PUBLIC ncnn MPI::MPI_CXX OpenMP::OpenMP_CXX)
add_executable(profile_layers profile_layers.cpp profile_gpu.cpp)
target_link_libraries(profile_layers PRIVATE autodice_runtime)
target_compile_options(profile_layers PRIVATE ${warnings})
add_executable(ncnn_check ncnn_check.cpp)
target_link_libraries(ncnn_check PRIVATE autodice_runtime)
target_compile_options(ncnn_check PRIVATE ${warnings})
add_executable(ncnn_int8 ncnn_int8.cpp)
target_link_libraries(ncnn_int8 PRIVATE autodice_runtime)
target_compile_options(ncnn_int8 PRIVATE ${warnings})
"""




def vulkan_devices(tools: Path) -> list[str]:
    """The Vulkan devices ncnn finds on this machine, in its order (none: an empty list)."""
    proc = subprocess.run([str(tools / "ncnn_check"), "--devices"], capture_output=True,
                          text=True, timeout=120, check=False)
    return [line.split("\t", 1)[1] for line in proc.stdout.splitlines() if "\t" in line]
