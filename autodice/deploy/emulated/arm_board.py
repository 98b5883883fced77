"""An emulated aarch64 board for the emulated cluster (``cluster up --arch edge02=aarch64``).

What is emulated is the CPU: every program of the board is an aarch64 binary, run by Debian's
``qemu-user-static`` through a ``binfmt_misc`` handler registered in the board's own user
namespace (:mod:`.userns`; the machine's global ``binfmt_misc`` is never touched). ``uname -m``
on the board says ``aarch64``, and so does a rank asking the kernel. What is not emulated: the
board's sshd is this machine's daemon (x86, started into the board's namespaces; the shells it
starts are the board's), and speed: qemu is several times slower than a real board
(docs/boards.md has the factor measured here).

The board's files are a real aarch64 Debian's, put at the paths a board has them:

- ``/usr/bin`` (and so ``/bin``) is the board's: ``busybox-static`` for the shell and the core
  tools, ``rsync`` and the ssh client, from Debian bookworm's arm64 packages;
- the C and C++ runtime (glibc, libstdc++, libgomp, zlib, and rsync's and ssh's libraries), from the
  packages, found by qemu through ``QEMU_LD_PREFIX`` (this machine has no ``/lib/aarch64-*`` to
  mount them on);
- the aarch64 build of this machine's Open MPI wheel, at the inventory's ``mpi_prefix``.

No compiler and no cmake: a board like this one gets its program cross-built (:mod:`.cross`).

The packages come through ``apt-get`` with a private state directory (its own package lists for
arm64), so nothing of this machine's apt or dpkg configuration changes. The root is assembled
once, cached under ``~/.cache/autodice/boards/``, and shared read-only by every such board.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ...core.errors import AutodiceError
from ..cross import machine_name, openmpi_for, toolchain

QEMU = Path("/usr/bin/qemu-aarch64-static")
DEBIAN_ARCH = "arm64"
SUITE = "bookworm"
# The board's runtime: what a Debian-based board has that the program and Open MPI link, busybox
# for the tools, rsync (deploy copies with it), the ssh client (mpirun on a board that holds
# rank 0 starts the others' daemons with it), and their libraries.
PACKAGES = ("libc6", "libgcc-s1", "libstdc++6", "libgomp1", "zlib1g", "busybox-static", "rsync",
            "libacl1", "liblz4-1", "libpopt0", "libssl3", "libxxhash0", "libzstd1",
            "openssh-client", "libselinux1", "libpcre2-8-0", "libgssapi-krb5-2", "libkrb5-3",
            "libk5crypto3", "libkrb5support0", "libcom-err2", "libkeyutils1")
# qemu's handler for 64-bit little-endian ARM ELF executables (magic and mask as in qemu's
# qemu-binfmt-conf.sh); F: the interpreter is opened now, so it works inside the board's
# mount namespace, where /usr/bin is the board's; P: argv[0] reaches the program as given —
# busybox picks its applet by it (without P, every applet the board's shell starts through
# /proc/self/exe, cat and env among them, ran as sh).
BINFMT = (r":qemu-aarch64:M::"
          r"\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:"
          r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:"
          f"{QEMU}:FP")
HOST_TOOLS = {"apt-get": "apt", "dpkg-deb": "dpkg", str(QEMU): "qemu-user-static"}


def emulated(arch: str) -> bool:
    """Whether ``arch`` is an emulated board (anything but this machine's own kind)."""
    import platform

    return machine_name(arch) != machine_name(platform.machine())


def check_arch(arch: str) -> str:
    """The ``uname -m`` name of an architecture a cluster host may have.

    Raises:
        AutodiceError: one that cannot be emulated here.
    """
    name = machine_name(arch)
    if not emulated(name):
        return name
    if name != "aarch64":
        toolchain(name)  # names what is missing for 32-bit ARM and others
        raise AutodiceError(f"{arch}: only aarch64 boards are emulated")
    return name


def missing_tools() -> list[str]:
    """Debian packages an emulated aarch64 board needs that this machine lacks."""
    return sorted({pkg for tool, pkg in HOST_TOOLS.items()
                   if not (Path(tool).exists() if tool.startswith("/") else shutil.which(tool))})


def board_root(console=None) -> Path:
    """The aarch64 board's files, assembled once into the cache (appears by rename).

    Raises:
        AutodiceError: a tool or a package that cannot be had.
    """
    from ...backend.engine import cache_root

    missing = missing_tools()
    if missing:
        raise AutodiceError(f"an emulated aarch64 board needs {', '.join(missing)} "
                            f"(apt-get install {' '.join(missing)})")
    mpi = openmpi_for(toolchain("aarch64"))
    key = hashlib.sha256(repr((SUITE, PACKAGES, mpi.name)).encode()).hexdigest()[:10]
    root = cache_root() / "boards" / f"aarch64-{key}"
    if (root / "usr" / "bin" / "sh").exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    if console is not None:
        console.print(f"assembling the aarch64 board's files (Debian {SUITE} arm64 packages)")
    with tempfile.TemporaryDirectory(dir=root.parent, prefix=".tmp-") as tmp:
        debs = _download(Path(tmp) / "debs", root.parent / "apt-arm64")
        staged = Path(tmp) / "root"
        for deb in debs:
            _run(["dpkg-deb", "-x", str(deb), str(staged)], f"unpacking {deb.name}")
        _merge_usr(staged)
        _relative_links(staged)
        _busybox_links(staged)
        (staged / "opt").mkdir(exist_ok=True)
        os.symlink(os.path.relpath(mpi, root / "opt"), staged / "opt" / "openmpi")  # once moved
        try:
            os.rename(staged, root)
        except OSError:  # another process assembled it first
            if not (root / "usr" / "bin" / "sh").exists():
                raise
    return root


def _download(dest: Path, state: Path) -> list[Path]:
    """``PACKAGES`` for arm64 as .deb files, with apt's lists and cache in ``state`` only."""
    sources = state / "sources.list.d"
    for d in (sources, state / "lists" / "partial", state / "cache" / "archives" / "partial"):
        d.mkdir(parents=True, exist_ok=True)
    mirror = _mirror()
    (sources / "board.sources").write_text(
        f"Types: deb\nURIs: {mirror}\nSuites: {SUITE}\nComponents: main\n"
        f"Architectures: {DEBIAN_ARCH}\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
    options = [f"-oDir::State={state}", "-oDir::State::status=/dev/null",
               f"-oDir::Cache={state / 'cache'}", "-oDir::Etc::SourceList=/dev/null",
               f"-oDir::Etc::SourceParts={sources}", f"-oAPT::Architecture={DEBIAN_ARCH}",
               f"-oAPT::Architectures::={DEBIAN_ARCH}", "-oDebug::NoLocking=1",
               "-oAPT::Sandbox::User=root"]
    _run(["apt-get", *options, "-q", "update"], f"apt-get update ({mirror}, {DEBIAN_ARCH})")
    dest.mkdir(parents=True)
    _run(["apt-get", *options, "-q", "download", *(f"{p}:{DEBIAN_ARCH}" for p in PACKAGES)],
         f"downloading the board's packages ({DEBIAN_ARCH})", cwd=dest)
    return sorted(dest.glob("*.deb"))


def _mirror() -> str:
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


def _merge_usr(root: Path) -> None:
    """Move ``/bin``, ``/sbin`` and ``/lib`` into ``/usr``, as a merged-/usr Debian has them (the
    board's ``/usr/bin`` is mounted on this machine's, which ``/bin`` links to)."""
    for top, into in (("bin", "bin"), ("sbin", "bin"), ("lib", "lib")):
        src = root / top
        if not src.is_dir() or src.is_symlink():
            continue
        for dirpath, dirnames, filenames in os.walk(src):
            for name in filenames + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]:
                item = Path(dirpath) / name
                target = root / "usr" / into / item.relative_to(src)
                target.parent.mkdir(parents=True, exist_ok=True)
                if not target.exists() and not target.is_symlink():
                    os.rename(item, target)
        shutil.rmtree(src)
        os.symlink(f"usr/{into}", src)


def _relative_links(root: Path) -> None:
    """Absolute symbolic links made relative, so they point into the board's files and not at
    this machine's (qemu opens the runtime's files with host paths)."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            link = Path(dirpath) / name
            if link.is_symlink() and os.readlink(link).startswith("/"):
                target = root / os.readlink(link).lstrip("/")
                link.unlink()
                link.symlink_to(os.path.relpath(target, link.parent))


def _busybox_links(root: Path) -> None:
    """A link in ``/usr/bin`` for each of busybox's tools that the packages do not provide."""
    busybox = root / "usr" / "bin" / "busybox"
    proc = subprocess.run([str(QEMU), str(busybox), "--list"], capture_output=True, text=True)
    if proc.returncode != 0 or "sh" not in proc.stdout.split():
        raise AutodiceError(f"running the board's busybox under {QEMU} failed: "
                            f"{proc.stderr.strip()[-200:]}")
    for tool in proc.stdout.split():
        link = busybox.parent / tool
        if not link.exists() and not link.is_symlink() and "/" not in tool:
            link.symlink_to("busybox")


def namespace_argv(root: Path, mpi_prefix: str, hostname: str) -> list[str]:
    """What a board's sshd is started under: its own user, mount and UTS namespaces with qemu's
    handler, the board's ``/usr/bin`` and its Open MPI at ``mpi_prefix``."""
    return [sys.executable, "-m", "autodice.deploy.emulated.userns", "--hostname", hostname,
            "--binfmt", BINFMT, "--bind", f"{root / 'usr' / 'bin'}:/usr/bin",
            "--bind", f"{(root / 'opt' / 'openmpi').resolve()}:{mpi_prefix}", "--"]


def sshd_options(root: Path) -> list[str]:
    """sshd_config lines for a board's sessions: qemu finds the board's runtime libraries."""
    return [f"SetEnv QEMU_LD_PREFIX={root}"]


def _run(cmd: list[str], what: str, cwd: Path | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd,
                          env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip().splitlines()
        raise AutodiceError(f"{what} failed: {said[-1] if said else f'exit {proc.returncode}'}")
