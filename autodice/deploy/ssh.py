"""How deploy reaches its hosts: ssh and rsync argument lists, and one step run on all at once.

One :class:`Ssh` per deploy writes an ssh config for the inventory and keeps one master
connection per host (opened by the first step, reused by every later ssh and rsync: no new
handshakes). :class:`Host` is a host's live state as the steps learn it, :class:`Build` where a
program lives on it, and :func:`parallel` runs a step on every host at once, turning each host's
failure into one line that names the host.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import AutodiceError
from .inventory import Inventory, Target

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


class Ssh:
    """ssh/rsync argument lists for one deploy: a config file plus shared master connections."""

    def __init__(self, inv: Inventory, work: Path):
        self.config = work / "ssh_config"
        self.config.write_text(ssh_config(inv.targets.values(), by="host"))
        # Socket paths must stay short (108 bytes), so not inside OUT.
        self.control = Path(tempfile.mkdtemp(prefix="adc-ssh-"))
        self.opts = ["-F", str(self.config), "-o", f"ControlPath={self.control}/%C"]

    def rsh(self) -> str:
        """rsync's ``-e``: a command line rsync splits itself, so quote each word."""
        return " ".join(shlex.quote(w) for w in ["ssh", *self.opts])

    def cmd(self, t: Target, *argv: str) -> list[str]:
        """``ssh host -- argv``; the remote shell sees each argument quoted."""
        return ["ssh", *self.opts, t.host, "--", " ".join(shlex.quote(a) for a in argv)]

    def script(self, t: Target, script: str, *args: str) -> list[str]:
        return self.cmd(t, "sh", "-c", script, "sh", *args)

    def open(self, t: Target, *argv: str) -> subprocess.CompletedProcess:
        """Start the master connection by running ``argv``; ssh exits 255 if it cannot connect.

        The master stays in the background (its stdio on /dev/null); later calls reuse it.
        """
        return subprocess.run(["ssh", *self.opts, "-o", "ControlMaster=yes",
                               "-o", "ControlPersist=900", t.host, "--",
                               " ".join(shlex.quote(a) for a in argv)],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=120)

    def close(self, targets) -> None:
        for t in targets:
            subprocess.run(["ssh", *self.opts, "-O", "exit", t.host], capture_output=True,
                           timeout=30)
        shutil.rmtree(self.control, ignore_errors=True)


def ssh_config(targets, by: str) -> str:
    """An ssh config naming each target ``by`` its host name (local) or its address (head).

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
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip().splitlines()
        raise AutodiceError(f"{what}: {said[-1] if said else f'exit {proc.returncode}'}")
    return proc
