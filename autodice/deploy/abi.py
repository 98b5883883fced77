"""Whether a board can load a program: its C and C++ runtime against what the program asks for.

A program linked here asks, by symbol version, for the glibc (``GLIBC_2.34``) and ``libstdc++``
(``GLIBCXX_3.4.30``) of the files it was linked against. A board whose runtime is older refuses
it with "version `GLIBC_2.34' not found", and only when mpirun starts it. So deploy learns each
board's runtime in its check (:data:`PROBE`), builds against a Debian release the board can load
(:func:`release_for`, :mod:`.cross`), and reads the binary's needs from its ELF before shipping
it (:func:`lacks`): a mismatch is one line naming the board and the version, before anything
runs. Only the two versioned families that differ between releases are compared; the others
(``GCC_``, ``GOMP_``, ``CXXABI_``) come from the same release's files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import AutodiceError
from .debian import RELEASES, Release

# Run on each host by the check (its output lines are facts): the glibc version, from getconf
# or, where there is none (a busybox board), from running libc itself; the libstdc++ file's
# version. $QEMU_LD_PREFIX is empty on a real board; on an emulated one it is where the
# board's libraries are.
PROBE = r"""
g=$(getconf GNU_LIBC_VERSION 2>/dev/null)
if [ -z "$g" ]; then
  for f in "$QEMU_LD_PREFIX"/lib/*-linux-gnu/libc.so.6 "$QEMU_LD_PREFIX"/lib64/libc.so.6; do
    [ -x "$f" ] && g=$("$f" 2>/dev/null | head -n 1) && break
  done
fi
echo "glibc=$g"
for f in "$QEMU_LD_PREFIX"/usr/lib/*-linux-gnu/libstdc++.so.6.0.* \
         "$QEMU_LD_PREFIX"/usr/lib64/libstdc++.so.6.0.*; do
  [ -f "$f" ] && echo "libstdcxx=${f##*.so.}" && break
done
"""
# Open MPI's wheels are manylinux_2_28: its mpirun and libmpi need glibc 2.28.
MPI_GLIBC = (2, 28)


@dataclass(frozen=True)
class Runtime:
    """A host's C and C++ runtime; None where the check could not tell."""

    glibc: tuple[int, int] | None = None
    glibcxx: int | None = None  # N of libstdc++.so.6.0.N, which provides GLIBCXX_3.4.N

    @classmethod
    def of(cls, facts: dict) -> Runtime:
        """From the check's facts (``glibc=glibc 2.31``, ``libstdcxx=6.0.28``)."""
        g = re.search(r"(\d+)\.(\d+)", facts.get("glibc", ""))
        s = re.fullmatch(r"6\.0\.(\d+)", facts.get("libstdcxx", ""))
        return cls((int(g[1]), int(g[2])) if g else None, int(s[1]) if s else None)

    def words(self) -> str:
        glibc = ".".join(map(str, self.glibc)) if self.glibc else "?"
        cxx = f"6.0.{self.glibcxx}" if self.glibcxx is not None else "?"
        return f"glibc {glibc}, libstdc++ {cxx}"

    def loads(self, other: Runtime) -> bool:
        """Whether a program built against ``other``'s files loads here."""
        return ((self.glibc is None or other.glibc is None or other.glibc <= self.glibc)
                and (self.glibcxx is None or other.glibcxx is None
                     or other.glibcxx <= self.glibcxx))


def of_release(r: Release) -> Runtime:
    return Runtime(r.glibc, r.glibcxx)


def release_for(board: Runtime, own: Runtime, where: str) -> Release | None:
    """The Debian release to build ``board``'s program against: None when the cross
    toolchain's own files (``own``) fit, else the newest release the board can load.

    Raises:
        AutodiceError: a board older than Open MPI's wheel or than every release known here,
            naming its runtime and what is needed.
    """
    if board.glibc is not None and board.glibc < MPI_GLIBC:
        raise AutodiceError(f"{where}: its glibc {'.'.join(map(str, board.glibc))} is older "
                            "than 2.28, which the Open MPI wheel (manylinux_2_28) needs: "
                            "update the board's OS")
    if board.loads(own):
        return None
    for r in RELEASES:
        if board.loads(of_release(r)):
            return r
    oldest = RELEASES[-1]
    raise AutodiceError(f"{where}: its runtime ({board.words()}) is older than Debian "
                        f"{oldest.suite}'s ({of_release(oldest).words()}), the oldest this "
                        'machine builds for: build on the board (build = "board")')


def _versions(path: Path, section: str) -> list[str]:
    """The version names of ``path``'s ``.gnu.version_r`` (needed) or ``.gnu.version_d``
    (defined)."""
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as f:
        found = ELFFile(f).get_section_by_name(section)
        if found is None:
            return []
        return [aux.name for _, auxes in found.iter_versions() for aux in auxes]


def _newest(names: list[str], family: str) -> tuple[int, ...] | None:
    nums = [tuple(map(int, m[1].split("."))) for n in names
            if (m := re.fullmatch(rf"{family}_(\d+(?:\.\d+)*)", n))]
    return max(nums) if nums else None


def needs(binary: Path) -> Runtime:
    """The newest glibc and libstdc++ a program asks for."""
    names = _versions(binary, ".gnu.version_r")
    glibc, cxx = _newest(names, "GLIBC"), _newest(names, "GLIBCXX")
    return Runtime(glibc[:2] if glibc else None, cxx[2] if cxx and len(cxx) > 2 else None)


def provided(libc: Path, libstdcxx: Path) -> Runtime:
    """The runtime a toolchain's own ``libc.so.6`` and ``libstdc++.so.6`` make."""
    glibc = _newest(_versions(libc, ".gnu.version_d"), "GLIBC")
    cxx = _newest(_versions(libstdcxx, ".gnu.version_d"), "GLIBCXX")
    return Runtime(glibc[:2] if glibc else None, cxx[2] if cxx and len(cxx) > 2 else None)


def lacks(binary: Path, board: Runtime) -> str:
    """What ``board`` lacks to load ``binary`` ("" when nothing, or when it could not tell)."""
    need = needs(binary)
    missing = []
    if need.glibc and board.glibc and need.glibc > board.glibc:
        missing.append(f"GLIBC_{'.'.join(map(str, need.glibc))}")
    if need.glibcxx is not None and board.glibcxx is not None and need.glibcxx > board.glibcxx:
        missing.append(f"GLIBCXX_3.4.{need.glibcxx}")
    if not missing:
        return ""
    return (f"the program needs {' and '.join(missing)}, and the board has {board.words()}")
