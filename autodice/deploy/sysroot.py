"""The files a cross build links against for a board whose runtime is older than this machine's.

Debian's cross compiler links its own glibc and libstdc++ (this machine's release). A board of an
older release, say Debian 11 or JetPack 5 (glibc 2.31), refuses such a program. So for such a
board the same compiler builds against that release's files instead: its glibc headers, start
files and libraries, and its gcc's libstdc++, libgcc and libgomp, from Debian's arm64 packages
(:mod:`.debian`), assembled once per release into ``~/.cache/autodice/sysroots/``.

The other way, this compiler's libstdc++ linked statically, was checked here and fails: the
program still needs glibc 2.32-2.36 (../shared/FACTS.md).

The flags keep the compiler's own glibc and libstdc++ out of the build: ``-nostdinc`` with the
release's include folders (and the compiler's own, for its built-in headers), ``-B`` so the
release's start files are found first, ``-L`` so its libraries are.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from .debian import Release, relative_links, unpacked


def packages(r: Release) -> tuple[str, ...]:
    """What a C++ OpenMP program builds and links against, of release ``r``."""
    return ("libc6", "libc6-dev", "linux-libc-dev", "libcrypt1", "libcrypt-dev",
            f"libstdc++-{r.gcc}-dev", f"libgcc-{r.gcc}-dev", "libstdc++6", "libgcc-s1",
            "libgomp1")


def sysroot(triple: str, debian_arch: str, r: Release, console=None) -> Path:
    """Release ``r``'s files for ``debian_arch``, assembled once into the cache."""
    from ..backend.engine import cache_root

    key = hashlib.sha256(repr((r, packages(r))).encode()).hexdigest()[:10]
    root = cache_root() / "sysroots" / f"{triple}-{r.suite}-{key}"
    if console is not None and not (root / "usr" / "include").is_dir():
        console.print(f"assembling Debian {r.suite}'s {debian_arch} files to build against")
    return unpacked(root, debian_arch, r.suite, packages(r), relative_links, ready="usr/include")


def flags(triple: str, r: Release, root: Path) -> tuple[list[str], list[str], list[str]]:
    """(C compile, C++ compile, link) flags that build against ``root`` only."""
    builtin = subprocess.run([f"{triple}-gcc", "-print-file-name=include"], capture_output=True,
                             text=True, check=True).stdout.strip()
    c_dirs = [builtin, f"{root}/usr/include/{triple}", f"{root}/usr/include"]
    cxx_dirs = [f"{root}/usr/include/c++/{r.gcc}", f"{root}/usr/include/{triple}/c++/{r.gcc}",
                f"{root}/usr/include/c++/{r.gcc}/backward", *c_dirs]
    gcc_lib = f"{root}/usr/lib/gcc/{triple}/{r.gcc}"
    link = [f"-B{root}/usr/lib/{triple}/", f"-B{gcc_lib}/", f"-L{gcc_lib}",
            f"-L{root}/usr/lib/{triple}", f"-L{root}/lib/{triple}"]

    def includes(dirs: list[str]) -> list[str]:
        return ["-nostdinc", *(f"-isystem{d}" for d in dirs)]

    return includes(c_dirs), includes(cxx_dirs), link
