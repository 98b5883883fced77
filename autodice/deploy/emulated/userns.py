"""``python -m autodice.deploy.emulated.userns``: run a command as the first process of an
emulated board of another architecture, in a user, mount and UTS namespace of its own.

Why a user namespace: since Linux 6.7 each user namespace has its own ``binfmt_misc``, so the
qemu-user handler that makes the board's aarch64 programs run is registered there and nowhere
else; the machine's global ``binfmt_misc`` is never touched. The user namespace maps every user
to itself (root writes the map from outside, which ``unshare --map-root-user`` cannot: it maps
root alone, and sshd's privilege separation needs its own user). The mount namespace, owned by
that user namespace, holds the board's own ``binfmt_misc`` and the bind mounts that make its
files what a real board would have at those paths (the aarch64 Open MPI at the inventory's
``mpi_prefix``).

Usage: ``... userns --hostname NAME [--binfmt LINE]... [--bind SRC:DST]... -- COMMAND...``
"""

from __future__ import annotations

import ctypes
import os
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWUSER = 0x10000000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
FULL_MAP = "0 0 4294967295\n"  # every id to itself


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)

    def check(result: int, what: str) -> None:
        if result != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    return libc, check


def enter(hostname: str, binfmt: list[str], binds: list[tuple[str, str]]) -> None:
    """Move this process into new namespaces (the parent writes the id maps), then set them up."""
    libc, check = _libc()
    ready_r, ready_w = os.pipe()
    mapped_r, mapped_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a helper outside: writes the maps once the board's namespace exists
        os.close(ready_w)
        os.close(mapped_r)
        os.read(ready_r, 1)
        parent = os.getppid()
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{parent}/{name}", "w") as f:
                f.write(FULL_MAP)
        os.write(mapped_w, b"1")
        os._exit(0)
    os.close(ready_r)
    os.close(mapped_w)
    check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWUTS), "unshare")
    os.write(ready_w, b"1")
    if os.read(mapped_r, 1) != b"1":
        raise OSError("the user namespace's id maps were not written")
    os.waitpid(pid, 0)
    os.setgid(0)
    os.setuid(0)  # re-evaluates capabilities against the new map: full ones, in the namespace
    check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "making mounts private")
    name = hostname.encode()
    check(libc.sethostname(name, len(name)), "sethostname")
    if binfmt:
        path = b"/proc/sys/fs/binfmt_misc"
        check(libc.mount(b"binfmt_misc", path, b"binfmt_misc", 0, None),
              "mounting this namespace's binfmt_misc (needs Linux >= 6.7)")
        for line in binfmt:
            with open("/proc/sys/fs/binfmt_misc/register", "w") as f:
                f.write(line)
    for src, dst in binds:
        check(libc.mount(src.encode(), dst.encode(), None, MS_BIND | MS_REC, None),
              f"bind-mounting {src} at {dst}")


def main(argv: list[str]) -> None:
    hostname, binfmt, binds = "", [], []
    args = list(argv)
    while args and args[0] != "--":
        flag, value = args.pop(0), args.pop(0)
        if flag == "--hostname":
            hostname = value
        elif flag == "--binfmt":
            binfmt.append(value)
        elif flag == "--bind":
            src, _, dst = value.partition(":")
            binds.append((src, dst))
        else:
            sys.exit(f"userns: unknown option {flag}")
    command = args[1:]
    if not command:
        sys.exit("userns: no command after --")
    enter(hostname, binfmt, binds)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
