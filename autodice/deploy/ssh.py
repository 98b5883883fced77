"""How deploy reaches its hosts: ssh and rsync argument lists, and one step run on all at once.

One :class:`Ssh` per deploy writes an ssh config for the inventory. Every ssh and rsync of a
host goes through one master connection (OpenSSH ControlMaster), opened by the first step and
kept open for ``keep_s`` seconds of idleness after the deploy (``ControlPersist``), so a
redeploy starts no new ssh handshake either. The masters are deliberate and bounded: each exits
by itself after ``keep_s`` idle seconds, or when its host goes away; ``keep_s=0`` closes them at
the end of the deploy. Their sockets live in a private directory of this user
(:func:`control_dir`), one per host *and* per way of checking that host (its config block and
the contents of the known_hosts files it trusts), so a connection is only reused by a deploy
that would have verified the host key exactly as the one that opened it did.
:func:`close_connections` closes them before their time.

:class:`Host` is a host's live state as the steps learn it, :class:`Build` where a program lives
on it, and :func:`parallel` runs a step on every host at once, turning each host's failure into
one line that names the host.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import stat
import subprocess
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import AutodiceError
from .inventory import Inventory, Target

if TYPE_CHECKING:
    from .cross import Toolchain

Progress = Callable[[str, str], None]  # (host, what it is doing now)


@dataclass
class Host:
    """One host's live state during a deploy: mutable, filled in by the steps as they learn it."""

    target: Target
    arch: str = ""
    cpus: int = 1
    cpus_all: int = 1
    sent: tuple[int, int, tuple[str, ...]] = (0, 0, ())
    builder: str = ""
    features: frozenset[str] = frozenset()  # CPU flags: what a build for this host may use
    facts: dict = field(default_factory=dict)  # what the check script said
    program: str = ""  # checksum of the program this host has (builders: after the build)
    compiled: bool = False
    lacks: tuple[str, ...] = ()  # what a build on the host would need and it has not
    cross: bool = False  # its program is cross-built on this machine (see .cross)
    toolchain: Toolchain | None = None  # what builds it there, for its runtime (see .head_build)

    @property
    def dir(self) -> str:
        return self.target.remote_dir


@dataclass(frozen=True)
class Build:
    """A CMake program built on every host: sources in ``ROOT/package``, built in ``ROOT/build``
    into ``exe``; ROOT is the remote directory itself (deploy's program) or ``folder`` inside it
    (another program, e.g. the link profiler), so two programs never share a build or a stamp."""

    folder: str = ""
    exe: str = "program"

    def root(self, h: Host) -> str:
        return f"{h.dir}/{self.folder}" if self.folder else h.dir

    def binary(self, h: Host) -> str:
        return f"{self.root(h)}/build/{self.exe}"


PROGRAM = Build()  # what deploy builds: the generated program


KEEP_S = 300  # default: how long an idle master connection waits for the next deploy
WHILE_DEPLOYING_S = 900  # with keep_s=0: long enough to outlive a deploy's idle moments


class Ssh:
    """ssh/rsync argument lists for one deploy: a config file plus shared master connections.

    Args:
        keep_s: seconds an idle master stays open after the deploy for the next one (0: closed
            by :meth:`close`).
    """

    def __init__(self, inv: Inventory, work: Path, keep_s: float = KEEP_S):
        self.keep_s = keep_s
        control = control_dir()
        self.sockets = {t.host: control / connection_key(t) for t in inv.targets.values()}
        self.config = work / "ssh_config"
        self.config.write_text(ssh_config(inv.targets.values(), by="host", control=self.sockets))
        self.opts = ["-F", str(self.config)]

    def rsh(self) -> str:
        """rsync's ``-e``: a command line rsync splits itself, so quote each word."""
        return " ".join(shlex.quote(w) for w in ["ssh", *self.opts])

    def cmd(self, t: Target, *argv: str, held: bool = False) -> list[str]:
        """``ssh -n host -- argv``; the remote shell sees each argument quoted. ``-n``: ssh
        would read our stdin while the command runs, and a stream fed on it (``--input -``)
        lost the frames waiting there to each command the deploy ran meanwhile. ``held``: no
        ``-n``, the caller gives the command a stdin of its own (``remote_build._run_held``)."""
        return ["ssh", *self.opts, *([] if held else ["-n"]), t.host, "--",
                " ".join(shlex.quote(a) for a in argv)]

    def script(self, t: Target, script: str, *args: str, held: bool = False) -> list[str]:
        return self.cmd(t, "sh", "-c", script, "sh", *args, held=held)

    def open(self, t: Target, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run ``argv`` through the host's master connection, opening one if there is none
        (ssh then exits 255 if it cannot connect).

        A master that is open but whose connection died under it (the host went away since)
        also makes ssh exit 255: then it is closed and ``argv`` runs once more on a fresh
        connection, so the error is the one that connection gives. A new master goes to the
        background (its stdio on /dev/null) once ``argv`` is done; later calls reuse it.
        """
        def run() -> subprocess.CompletedProcess:
            # keep_s=0: the masters live through the deploy, and close() ends them after it.
            persist = round(self.keep_s) if self.keep_s > 0 else WHILE_DEPLOYING_S
            return subprocess.run(["ssh", *self.opts, "-o", "ControlMaster=auto",
                                   "-o", f"ControlPersist={max(1, persist)}",
                                   t.host, "--", " ".join(shlex.quote(a) for a in argv)],
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=timeout)

        reused = self.sockets[t.host].exists()
        proc = run()
        if proc.returncode == 255 and reused:
            close_connections([t], now=True, sockets=self.sockets)
            proc = run()
        return proc

    def close(self, targets) -> None:
        """End of a deploy: with ``keep_s=0`` close the masters, else leave them to their idle
        timeout."""
        if self.keep_s <= 0:
            close_connections(targets, sockets=self.sockets)


def close_connections(targets, now: bool = False,
                      sockets: dict[str, Path] | None = None) -> list[str]:
    """Close the master connections deploys keep open to ``targets`` (each also ends by itself
    once idle for the ``keep_s`` of the deploy that opened it, or when its host goes away).

    Deploys to the same hosts share masters, so a master stops taking new sessions and ends
    with its last one (``-O stop``): another deploy's rsync or mpirun through it goes on.
    ``now``: end it at once, sessions and all (``-O exit``; for a master whose connection died).
    ``sockets``: the masters' sockets by host as a deploy named them when it began (the names
    hash known_hosts, which ssh may have added to since).

    Returns:
        The hosts whose connection was open.
    """
    open_ = [(t, sockets[t.host] if sockets else control_dir() / connection_key(t))
             for t in targets]
    open_ = [(t, sock) for t, sock in open_ if sock.exists()]

    def close(item) -> None:
        t, sock = item
        said = subprocess.run(["ssh", "-F", "/dev/null", "-o", f"ControlPath={sock}", "-O",
                               "exit" if now else "stop", t.host], capture_output=True,
                              timeout=30)
        if now or said.returncode != 0:  # (a stopped master removes its socket itself)
            sock.unlink(missing_ok=True)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(close, open_))
    return [t.host for t, _ in open_]


def control_dir() -> Path:
    """This user's private directory for master sockets (short: a socket path has 108 bytes).

    Raises:
        AutodiceError: the directory exists but is not this user's own, private directory.
    """
    path = Path(tempfile.gettempdir()) / f"autodice-ssh-{os.getuid()}"
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    info = path.lstat()
    if (not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid()
            or info.st_mode & 0o077):
        raise AutodiceError(f"{path}: not a private directory of this user (mode "
                            f"{stat.S_IMODE(info.st_mode):o}, owner {info.st_uid}); remove it")
    return path


def connection_key(t: Target) -> str:
    """Names a master connection by everything that decides how ssh reaches and verifies the
    host: its config block and the contents of the known_hosts files that vouch for its key."""
    digest = hashlib.sha256(ssh_config([t], by="host").encode())
    files = [t.known_hosts] if t.known_hosts else [  # ssh's defaults
        str(Path(f"~/.ssh/{name}").expanduser()) for name in ("known_hosts", "known_hosts2")]
    files += ["/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2"]  # always read
    for f in files:
        try:
            digest.update(b"\0" + Path(f).read_bytes())
        except OSError:
            digest.update(b"\0-")
    return digest.hexdigest()[:24]


def ssh_config(targets, by: str, control: dict[str, Path] | None = None) -> str:
    """An ssh config naming each target ``by`` its host name (local) or its address (head);
    ``control``: host -> the socket of its master connection.

    Host-key checking stays strict: a host whose key is not in known_hosts is refused.
    """
    blocks = []
    for t in targets:
        lines = [f"Host {t.host if by == 'host' else t.address}", f"  HostName {t.address}",
                 f"  Port {t.port}", f"  User {t.user}"]
        if t.identity:
            lines += [f"  IdentityFile {t.identity}", "  IdentitiesOnly yes"]
        if t.known_hosts:
            lines.append(f"  UserKnownHostsFile {t.known_hosts}")
        if control:
            lines += [f"  ControlPath {control[t.host]}", "  ControlMaster no"]
        blocks.append("\n".join(lines))
    blocks.append("\n".join(["Host *", "  StrictHostKeyChecking yes", "  BatchMode yes",
                             "  ConnectTimeout 10", "  ServerAliveInterval 5",
                             "  ServerAliveCountMax 3", "  LogLevel ERROR"]))
    return "\n\n".join(blocks) + "\n"


def why_ssh_failed(said: str) -> str:
    """What kind of failure ssh's stderr ``said`` shows, with its last line as the detail."""
    text = said.lower()
    if "permission denied" in text:
        kind = "authentication failed"
    elif "host key" in text:
        kind = "host key verification failed"
    elif any(s in text for s in ("refused", "no route", "timed out", "unreachable",
                                 "could not resolve", "closed by remote")):
        kind = "unreachable"
    else:
        kind = "ssh failed"
    lines = [ln for ln in said.splitlines() if ln.strip()]
    return f"{kind} ({lines[-1].strip() if lines else 'no message'})"


def parallel(hosts: list[Host], step: str, fn, progress: Progress,
             label: str | None = None) -> list[str]:
    """Run ``fn(host)`` for every host at once; returns one problem line per failed host.

    Each line is ``host (user@address:port): step: what went wrong``; with an empty ``step``
    the error names its own step.
    """
    problems: dict[str, str] = {}

    def one(h: Host) -> None:
        progress(h.target.host, label or step)
        try:
            fn(h)
        except AutodiceError as e:
            problems[h.target.host] = "\n".join(e.problems)
        except subprocess.TimeoutExpired as e:
            problems[h.target.host] = f"timed out after {e.timeout:.0f} s"
        else:
            return
        progress(h.target.host, f"{label or step} failed")

    with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        list(pool.map(one, hosts))
    return [f"{h.target.where()}: {step + ': ' if step else ''}{problems[h.target.host]}"
            for h in hosts if h.target.host in problems]


def must(cmd: list[str], what: str, timeout: float | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd``; a non-zero exit becomes ``what: <its last line of output>``.

    Raises:
        AutodiceError: the command failed.
    """
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)  # not the caller's: see Ssh.cmd
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip().splitlines()
        raise AutodiceError(f"{what}: {said[-1] if said else f'exit {proc.returncode}'}")
    return proc
