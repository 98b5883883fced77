"""Debian packages of another architecture and release, unpacked into a folder of the cache.

Two things here are made of them: an emulated board's files (:mod:`.emulated.arm_board`) and
the sysroot a cross build links against when a board's C runtime is older than the cross
compiler's (:mod:`.cross`). Both come through ``apt-get download`` with a private state
directory (its own package lists for that architecture and release), so nothing of this
machine's apt or dpkg configuration changes, and both appear in the cache by rename, whole.

:data:`RELEASES` says what each Debian release's runtime is: its glibc and the newest
``libstdc++`` symbol version (``GLIBCXX_3.4.N``) it provides. A program built against a
release's files loads on any board whose runtime is as new or newer: bullseye's (glibc 2.31,
gcc 10) is also Ubuntu 20.04's, so JetPack 5's, and Raspberry Pi OS bullseye's.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import AutodiceError


@dataclass(frozen=True)
class Release:
    """A Debian release whose files a board's program may be built against."""

    suite: str
    glibc: tuple[int, int]  # its glibc's version
    glibcxx: int  # the newest GLIBCXX_3.4.N its libstdc++.so.6 (6.0.N) provides
    gcc: int  # the gcc whose libstdc++, libgcc and libgomp it ships


# Newest first: the first one a board can load is the one chosen.
RELEASES = (Release("bookworm", (2, 36), 30, 12), Release("bullseye", (2, 31), 28, 10))
DEFAULT_SUITE = "bookworm"


def release(suite: str) -> Release:
    """The release called ``suite``.

    Raises:
        AutodiceError: a suite not in :data:`RELEASES`.
    """
    for r in RELEASES:
        if r.suite == suite:
            return r
    raise AutodiceError(f'"{suite}" is not a Debian release known here (known: '
                        f"{', '.join(r.suite for r in RELEASES)})")


def unpacked(folder: Path, arch: str, suite: str, packages: tuple[str, ...],
             finish: Callable[[Path], None], ready: str = "usr") -> Path:
    """``folder``, holding ``packages`` for Debian architecture ``arch`` of ``suite`` unpacked
    (``dpkg-deb -x``), then ``finish(root)``; made once, in a temporary folder beside it that
    is renamed into place, so a reader sees all of it or nothing.

    Args:
        ready: a path inside that exists once the folder is complete.
    Raises:
        AutodiceError: apt or dpkg-deb failing, with their last line.
    """
    if (folder / ready).exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".tmp-") as tmp:
        debs = download(Path(tmp) / "debs", folder.parent / f"apt-{arch}-{suite}", arch, suite,
                        packages)
        staged = Path(tmp) / "root"
        for deb in debs:
            run(["dpkg-deb", "-x", str(deb), str(staged)], f"unpacking {deb.name}")
        finish(staged)
        try:
            os.rename(staged, folder)
        except OSError:  # another process made it first
            if not (folder / ready).exists():
                raise
    return folder


def relative_links(root: Path) -> None:
    """Absolute symbolic links made relative, so they point into ``root`` and not at this
    machine's files (``libm.so -> /lib/.../libm.so.6``: the linker and qemu open them with this
    machine's paths)."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            link = Path(dirpath) / name
            if link.is_symlink() and os.readlink(link).startswith("/"):
                target = root / os.readlink(link).lstrip("/")
                link.unlink()
                link.symlink_to(os.path.relpath(target, link.parent))


def download(dest: Path, state: Path, arch: str, suite: str,
             packages: tuple[str, ...]) -> list[Path]:
    """``packages`` of ``suite`` for ``arch`` as .deb files in ``dest``, with apt's lists and
    cache in ``state`` only."""
    sources = state / "sources.list.d"
    for d in (sources, state / "lists" / "partial", state / "cache" / "archives" / "partial"):
        d.mkdir(parents=True, exist_ok=True)
    url = mirror()
    (sources / "board.sources").write_text(
        f"Types: deb\nURIs: {url}\nSuites: {suite}\nComponents: main\n"
        f"Architectures: {arch}\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
    options = [f"-oDir::State={state}", "-oDir::State::status=/dev/null",
               f"-oDir::Cache={state / 'cache'}", "-oDir::Etc::SourceList=/dev/null",
               f"-oDir::Etc::SourceParts={sources}", f"-oAPT::Architecture={arch}",
               f"-oAPT::Architectures::={arch}", "-oDebug::NoLocking=1",
               "-oAPT::Sandbox::User=root"]
    run(["apt-get", *options, "-q", "update"], f"apt-get update ({url} {suite}, {arch})")
    dest.mkdir(parents=True)
    run(["apt-get", *options, "-q", "download", *(f"{p}:{arch}" for p in packages)],
        f"downloading Debian {suite} packages ({arch})", cwd=dest)
    return sorted(dest.glob("*.deb"))


def mirror() -> str:
    """The Debian mirror this machine's apt uses (its first ``deb.debian.org``-like source)."""
    for f in sorted(Path("/etc/apt").glob("sources.list.d/*.sources")) + [
            Path("/etc/apt/sources.list")]:
        try:
            text = f.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            words = line.split()
            url = (words[1] if words[:1] == ["URIs:"] else
                   words[1] if words[:1] == ["deb"] and len(words) > 2 else "")
            if url and "security" not in url:
                return url
    return "http://deb.debian.org/debian"


def run(cmd: list[str], what: str, cwd: Path | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd,
                          env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip().splitlines()
        raise AutodiceError(f"{what} failed: {said[-1] if said else f'exit {proc.returncode}'}")
