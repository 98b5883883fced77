"""``autodice build``: compile each architecture's program once (packages share the source).

The runtime (``runtime/`` of every package) is the same in every program: it is compiled once
per machine, compiler and flags and kept as a static library in the cache
(:func:`kept_runtime`), so building a new plan compiles only its ``program.cpp``.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
from pathlib import Path

from ..core.errors import AutodiceError
from ..core.outdir import claim
from ..core.plan import load_plan
from .engine import cache_root, cmake_args, ensure_ncnn
from .gen import RUNTIME_SOURCES

RUNTIME_LIB = "libautodice_runtime.a"  # what the package's CMakeLists builds of runtime/
# What the runtime library is built from: the CMakeLists holds its compile options.
RUNTIME_FILES = ("CMakeLists.txt", *(f"runtime/{name}" for name in RUNTIME_SOURCES))


def files_digest(package: Path, files: tuple[str, ...]) -> str:
    """A short hash of ``files`` (paths inside ``package``), names and contents."""
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.encode() + b"\0" + (package / f).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def kept_runtime(package: Path, flags: list[str], cxx: str = "") -> Path:
    """Where the runtime library of ``package`` built with these cmake ``flags`` and C++
    compiler is kept (it may not be there yet: :func:`keep_runtime` puts it there).

    The key is everything the objects depend on: the runtime's sources and compile options, the
    flags (build type, MPI, ncnn, a cross toolchain), the compiler's version and ``CXXFLAGS``
    (cmake adds them: ``-D_GLIBCXX_DEBUG`` changes the containers' layout), and ncnn's
    ``platform.h`` (its version and configuration), so an ncnn rebuilt in place gets a new one.

    Raises:
        AutodiceError: the compiler (``CXX``, which may hold a launcher: ``ccache g++``) does
            not run.
    """
    cxx = cxx or os.environ.get("CXX") or "c++"
    try:
        version = subprocess.run([*shlex.split(cxx), "--version"], capture_output=True,
                                 text=True).stdout
    except (OSError, ValueError) as e:
        raise AutodiceError(f"CXX={cxx}: cannot run the C++ compiler ({e})") from None
    ncnn = next((f.partition("=")[2] for f in flags if f.startswith("-Dncnn_DIR=")), "")
    platform_h = Path(ncnn).parent.parent.parent / "include" / "ncnn" / "platform.h"
    digest = hashlib.sha256()
    for part in (files_digest(package, RUNTIME_FILES), *flags, cxx, version,
                 os.environ.get("CXXFLAGS", ""),
                 platform_h.read_text(errors="replace") if platform_h.is_file() else ""):
        digest.update(part.encode() + b"\0")
    return cache_root() / "runtime" / digest.hexdigest()[:16] / RUNTIME_LIB


def keep_runtime(build_dir: Path, lib: Path) -> None:
    """Keep the runtime library a build compiled (it had none to link) at ``lib``; by rename,
    so a concurrent build never links half a file."""
    built = build_dir / RUNTIME_LIB
    if lib.is_file() or not built.is_file():
        return
    lib.parent.mkdir(parents=True, exist_ok=True)
    tmp = lib.with_name(f".{lib.name}.{os.getpid()}")
    shutil.copyfile(built, tmp)
    os.replace(tmp, lib)


def run_logged(cmd: list[str], log: Path, what: str) -> None:
    """Run ``cmd`` with its output appended to ``log``; a failure names the log and its tail."""
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise AutodiceError(f"{what} failed (log: {log}):", *tail)


def configured_elsewhere(bdir: Path, package: Path) -> bool:
    """Whether ``bdir`` holds CMake's cache of another source folder: an output folder copied or
    moved with its build, which CMake refuses to configure again ("CMakeCache.txt directory ...
    is different")."""
    try:
        cache = (bdir / "CMakeCache.txt").read_text(errors="replace")
    except OSError:
        return False
    for line in cache.splitlines():
        if line.startswith("CMAKE_HOME_DIRECTORY:INTERNAL="):
            return Path(line.partition("=")[2]).resolve() != package.resolve()
    return False


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
    package = packages / plan.hosts()[0]
    if configured_elsewhere(bdir, package):
        shutil.rmtree(bdir)
    bdir.mkdir(parents=True, exist_ok=True)
    log = bdir / "build.log"
    log.write_text("")
    flags = ["-DCMAKE_BUILD_TYPE=Release", *cmake_args(ncnn)]
    runtime = kept_runtime(package, flags)
    run_logged(["cmake", "-S", str(package), "-B", str(bdir), *flags,
                f"-DAUTODICE_RUNTIME_LIB={runtime}"], log, "configuring")
    run_logged(["cmake", "--build", str(bdir), "-j", str(os.cpu_count() or 2)], log, "compiling")
    keep_runtime(bdir, runtime)
    program = bdir / "program"
    for host in plan.hosts():
        (packages / host / "build").mkdir(exist_ok=True)
        link = packages / host / "build" / "program"
        link.unlink(missing_ok=True)
        link.symlink_to(os.path.relpath(program, link.parent))
    return program
