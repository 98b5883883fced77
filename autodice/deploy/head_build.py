"""Step 3 of deploy for boards whose program is cross-built on this machine (:mod:`.cross`).

:func:`choose` decides per host, once the check has said what each host is: a host whose
``uname -m`` contradicts the platform file's architecture is an error (before anything is
built); a board of another architecture than this machine's is cross-built here when the
inventory says ``build = "head"``, or says nothing and the cross compiler is installed; every
other host builds on itself (or gets its group's binary), as before. A host that can do neither
is an error naming the package to install.

:class:`HeadBuilds` then builds once per toolchain here, only when the sources or flags
differ from the stamp the last build left, in ``OUT/deploy/cross/<key>/`` (``aarch64``, or
``aarch64-bullseye`` for boards whose runtime is older than the compiler's: :mod:`.sysroot`),
and hands the binary to :mod:`.remote_build`, which ships it to every board of that kind whose
copy differs, once its ELF says the board can load it (:mod:`.abi`).
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from ..backend.build import keep_runtime, kept_runtime, run_logged
from ..core.errors import AutodiceError
from ..core.spec import Device
from .abi import Runtime, lacks
from .cross import Toolchain, machine_name, ncnn_for, program_flags, require, toolchain
from .ssh import Build, Host

HERE = "this machine (cross-compiled)"  # the builder deploy reports for such hosts
_FAMILY = {"aarch64": "arm", "armv7l": "arm", "armv6l": "arm", "x86_64": "x86", "i686": "x86"}


def family_word(family: str) -> str:
    """The platform file's word for an architecture family (``x86``, ``arm``), or ``cpu``."""
    return family if family in ("arm", "x86") else "cpu"


def choose(hosts: list[Host], devices: dict[str, Device] | None = None) -> None:
    """Set ``h.cross`` for every host; all problems of all hosts in one error.

    Args:
        devices: the platform file's devices (host name -> device), for the architecture check.
    Raises:
        AutodiceError: a host that is not what the platform file says, or that can neither be
            cross-built for nor build itself.
    """
    local = machine_name(platform.machine())
    problems = []
    for h in hosts:
        t, arch = h.target, machine_name(h.arch)
        device = (devices or {}).get(t.host)
        family = _FAMILY.get(arch, arch)
        if device is not None and device.arch in ("arm", "x86") and device.arch != family:
            problems.append(f"{t.where()}: the platform file says {device.arch} but the host "
                            f"is {arch} (uname -m): write {family_word(family)} or cpu (any "
                            f"architecture) for {t.host} in the platform file"
                            + (f", or, on an emulated cluster, make it a board: `autodice cluster "
                               f"up --arch {t.host}=aarch64 ...`" if device.arch == "arm" else ""))
            continue
        other = arch != local
        try:
            tc = toolchain(arch) if other else None
        except AutodiceError as e:
            tc, no_toolchain = None, e.problems[0]
        else:
            no_toolchain = ""
        if t.build == "head":
            if not other:
                problems.append(f'{t.where()}: build = "head" is for boards of another '
                                f"architecture; this one is {arch} like this machine: it builds "
                                'itself (remove the key or say "board")')
                continue
            try:
                if tc is None:
                    raise AutodiceError(no_toolchain)
                require(tc)
            except AutodiceError as e:
                problems.append(f"{t.where()}: {e.problems[0]}")
                continue
            h.cross = True
        elif t.build is None and tc is not None and tc.installed():
            h.cross = True
        elif h.lacks:
            hint = (f"; or apt-get install {tc.package} here to cross-build for it" if tc
                    else f"; {no_toolchain}" if no_toolchain else "")
            problems.append(f"{t.where()}: check: missing {', '.join(h.lacks)} to build on the "
                            f"host{hint}")
        if h.cross and tc is not None:  # built against files the board's runtime can load
            try:
                h.toolchain = tc.for_board(Runtime.of(h.facts), t.where())
            except AutodiceError as e:
                problems.append(e.problems[0])
    if problems:
        raise AutodiceError(*problems)


class HeadBuilds:
    """The cross builds of one deploy: one per toolchain (an architecture, and the Debian release
    its boards' runtime asks for), made by the first host that needs it while the others wait,
    then kept for them.

    Args:
        work: where the builds live (``OUT/deploy``): ``cross/<key>/<folder>`` (``aarch64``,
            ``aarch64-bullseye``).
        package: the local source folder for a host (the package its sync sends).
        ncnn_flags: the ncnn switches for a group of hosts (:func:`group_ncnn_flags`).
        runtime: the package has the runtime library, kept in this machine's cache per
            architecture and flags (:func:`~autodice.backend.build.kept_runtime`).
    """

    def __init__(self, work: Path, sources: str, package: Callable[[Host], Path],
                 ncnn_flags: Callable[[list[Host]], dict[str, str]], build: Build,
                 runtime: bool = False):
        self.work, self.sources, self.package = work, sources, package
        self.ncnn_flags, self.build, self.runtime = ncnn_flags, build, runtime
        self._lock = threading.Lock()
        self._done: dict[str, tuple[Path, str]] = {}
        self._locks: dict[str, threading.Lock] = {}

    def binary(self, h: Host, group: list[Host]) -> tuple[Path, str, bool]:
        """(binary, its checksum as the check script writes it, compiled now) for ``h``'s
        toolchain, building it the first time it is asked for.

        Raises:
            AutodiceError: the build failed, or its binary asks for a glibc or libstdc++
                newer than ``h``'s (:func:`.abi.lacks`): nothing is shipped then.
        """
        tc = h.toolchain or toolchain(h.arch)
        with self._lock:
            lock = self._locks.setdefault(tc.key, threading.Lock())
        with lock:
            compiled = False
            if tc.key not in self._done:
                compiled = self._build(tc, h, group)
                path = self.folder(tc.key) / "build" / self.build.exe
                self._done[tc.key] = (path, _cksum(path))
            path, checksum = self._done[tc.key]
        why = lacks(path, Runtime.of(h.facts))
        if why:
            raise AutodiceError(f"{why}: {path}")
        return path, checksum, compiled

    def folder(self, key: str) -> Path:
        return self.work / "cross" / key / (self.build.folder or "program")

    def _build(self, tc: Toolchain, h: Host, group: list[Host]) -> bool:
        ncnn = ncnn_for(tc, self.ncnn_flags(group))
        flags = program_flags(tc, ncnn, h.target.mpi_prefix)
        lib = kept_runtime(self.package(h), flags, tc.cxx) if self.runtime else None
        if lib is not None:
            flags.append(f"-DAUTODICE_RUNTIME_LIB={lib}")
        stamp = f"{self.sources}-{hashlib.sha256(' '.join(flags).encode()).hexdigest()[:12]}"
        root = self.folder(tc.key)
        bdir, exe = root / "build", root / "build" / self.build.exe
        if exe.is_file() and _read(bdir / "autodice-built") == stamp:
            return False
        bdir.mkdir(parents=True, exist_ok=True)
        log = root / "build.log"
        log.write_text("")
        (bdir / "autodice-built").unlink(missing_ok=True)
        if _read(bdir / "autodice-flags") != " ".join(flags):
            run_logged(["cmake", "-S", str(self.package(h)), "-B", str(bdir), *flags], log,
                 f"configuring the {tc.key} cross build")
            (bdir / "autodice-flags").write_text(" ".join(flags))
        run_logged(["cmake", "--build", str(bdir), "-j", str(os.cpu_count() or 2)], log,
             f"cross-compiling for {tc.key}")
        if lib is not None:
            keep_runtime(bdir, lib)
        (bdir / "autodice-built").write_text(stamp)
        return True


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _cksum(path: Path) -> str:
    """``cksum < path`` as the hosts' check script prints it: CRC and size."""
    with open(path, "rb") as f:
        return subprocess.run(["cksum"], stdin=f, capture_output=True, text=True,
                              check=True).stdout.strip()
