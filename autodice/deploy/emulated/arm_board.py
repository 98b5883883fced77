"""An emulated aarch64 board for the emulated cluster (``cluster up --arch edge02=aarch64``, or
``edge02=aarch64:bullseye`` for a board with an older OS).

What is emulated is the CPU: every program of the board is an aarch64 binary, run by Debian's
``qemu-user-static`` through a ``binfmt_misc`` handler registered in the board's own user
namespace (:mod:`.userns`; the machine's global ``binfmt_misc`` is never touched). ``uname -m``
on the board says ``aarch64``, and so does a rank asking the kernel. What is not emulated: the
board's sshd is this machine's daemon (x86, started into the board's namespaces; the shells it
starts are the board's), and speed: qemu is several times slower than a real board
(docs/boards.md has the factor measured here).

The board's files are a real aarch64 Debian's, put at the paths a board has them:

- ``/usr/bin`` (and so ``/bin``) is the board's: ``busybox-static`` for the shell and the core
  tools, ``rsync`` and the ssh client, from the arm64 packages of its Debian release (bookworm
  unless ``--arch`` names another);
- the C and C++ runtime (glibc, libstdc++, libgomp, zlib, and rsync's and ssh's libraries), from the
  packages, found by qemu through ``QEMU_LD_PREFIX`` (this machine has no ``/lib/aarch64-*`` to
  mount them on);
- the aarch64 build of this machine's Open MPI wheel, at the inventory's ``mpi_prefix``.

No compiler and no cmake: a board like this one gets its program cross-built (:mod:`.cross`).

The packages come through ``apt-get`` with a private state directory (:mod:`..debian`), so
nothing of this machine's apt or dpkg configuration changes. The root is assembled once per
release, cached under ``~/.cache/autodice/boards/``, and shared read-only by every such board.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ...core.errors import AutodiceError
from ..cross import machine_name, openmpi_for, toolchain
from ..debian import DEFAULT_SUITE, relative_links, release, unpacked

QEMU = Path("/usr/bin/qemu-aarch64-static")
DEBIAN_ARCH = "arm64"
# The board's runtime: what a Debian-based board has that the program and Open MPI link, busybox
# for the tools, rsync (deploy copies with it), the ssh client (mpirun on a board that holds
# rank 0 starts the others' daemons with it), and their libraries; OpenSSL's soname is the
# release's.
PACKAGES = ("libc6", "libgcc-s1", "libstdc++6", "libgomp1", "zlib1g", "busybox-static", "rsync",
            "libacl1", "liblz4-1", "libpopt0", "libxxhash0", "libzstd1",
            "openssh-client", "libselinux1", "libpcre2-8-0", "libgssapi-krb5-2", "libkrb5-3",
            "libk5crypto3", "libkrb5support0", "libcom-err2", "libkeyutils1")
SUITE_PACKAGES = {"bookworm": ("libssl3",), "bullseye": ("libssl1.1",)}
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


def check_arch(arch: str) -> tuple[str, str]:
    """(``uname -m`` name, Debian release) of a cluster host's ``--arch`` value: ``aarch64``
    is a board running Debian bookworm, ``aarch64:bullseye`` one running bullseye (glibc 2.31,
    as JetPack 5 and Raspberry Pi OS bullseye have).

    Raises:
        AutodiceError: an architecture that cannot be emulated here, or a release not known.
    """
    machine, _, suite = arch.partition(":")
    name = machine_name(machine)
    if not emulated(name):
        if suite:
            raise AutodiceError("a host of this machine's kind runs this machine's OS (a Debian "
                                "release is for an emulated board)")
        return name, ""
    if name != "aarch64":
        toolchain(name)  # names what is missing for 32-bit ARM and others
        raise AutodiceError(f"{arch}: only aarch64 boards are emulated")
    release(suite or DEFAULT_SUITE)
    return name, suite


def missing_tools() -> list[str]:
    """Debian packages an emulated aarch64 board needs that this machine lacks."""
    return sorted({pkg for tool, pkg in HOST_TOOLS.items()
                   if not (Path(tool).exists() if tool.startswith("/") else shutil.which(tool))})


def board_root(suite: str = DEFAULT_SUITE, console=None) -> Path:
    """The files of an aarch64 board running Debian ``suite``, assembled once into the cache.

    Raises:
        AutodiceError: a tool, a release or a package that cannot be had.
    """
    from ...backend.engine import cache_root

    missing = missing_tools()
    if missing:
        raise AutodiceError(f"an emulated aarch64 board needs {', '.join(missing)} "
                            f"(apt-get install {' '.join(missing)})")
    release(suite)
    packages = (*PACKAGES, *SUITE_PACKAGES[suite])
    mpi = openmpi_for(toolchain("aarch64"))
    key = hashlib.sha256(repr((suite, packages, mpi.name)).encode()).hexdigest()[:10]
    root = cache_root() / "boards" / f"aarch64-{suite}-{key}"

    def finish(staged: Path) -> None:
        _merge_usr(staged)
        relative_links(staged)
        _busybox_links(staged)
        (staged / "opt").mkdir(exist_ok=True)
        os.symlink(os.path.relpath(mpi, root / "opt"), staged / "opt" / "openmpi")  # once moved

    if console is not None and not (root / "usr" / "bin" / "sh").exists():
        console.print(f"assembling the aarch64 board's files (Debian {suite} arm64 packages)")
    return unpacked(root, DEBIAN_ARCH, suite, packages, finish, ready="usr/bin/sh")


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
