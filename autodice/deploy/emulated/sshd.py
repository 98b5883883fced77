"""Each emulated host's sshd: its host key and config under the cluster's state directory, the
daemon started inside the host's namespace (with its own hostname, pinned to its cores), and
how to tell it is alive."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ...core.errors import AutodiceError
from .arm_board import namespace_argv, sshd_options

if TYPE_CHECKING:
    from .state import Cluster, Host


def _keygen(*args: str) -> None:
    proc = subprocess.run(["ssh-keygen", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise AutodiceError(f"cluster: `ssh-keygen {' '.join(args)}` failed: "
                            f"{(proc.stderr or proc.stdout).strip()}")


def create_keys(c: Cluster, boards: dict[str, Path] | None = None) -> None:
    """Host and client keys, known_hosts, and each host's sshd config (``boards``: host name ->
    the files of each emulated board among them, :func:`~.arm_board.board_root`)."""
    root = Path(c.state_dir)
    root.chmod(0o700)
    _keygen("-q", "-t", "ed25519", "-N", "", "-C", "autodice-cluster",
         "-f", str(c.identity))
    client = c.identity.with_suffix(".pub").read_text().strip()
    # Only from the cluster's subnet: the key lets in nobody from elsewhere.
    (root / "authorized_keys").write_text(f'from="{c.subnet}" {client}\n')
    known = []
    for h in c.hosts:
        key = root / "hosts" / h.name / "ssh_host_ed25519_key"
        _keygen("-q", "-t", "ed25519", "-N", "", "-C", h.name, "-f", str(key))
        kind, blob = key.with_suffix(".pub").read_text().split()[:2]
        known.append(f"{h.name},{h.address} {kind} {blob}\n")
    c.known_hosts.write_text("".join(known))
    for h in c.hosts:
        folder = root / "hosts" / h.name
        board = (boards or {}).get(h.name)
        extra = sshd_options(board) if h.arch and board else []
        (folder / "sshd_config").write_text(_config(c, h, folder, extra))


def _config(c: Cluster, h: Host, folder: Path, extra: list[str]) -> str:
    return "\n".join([
        f"# sshd of emulated host {h.name} (autodice cluster)",
        f"ListenAddress {h.address}",
        "Port 22",
        f"HostKey {folder / 'ssh_host_ed25519_key'}",
        f"PidFile {folder / 'sshd.pid'}",
        f"AuthorizedKeysFile {Path(c.state_dir) / 'authorized_keys'}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "PrintMotd no",
        "X11Forwarding no",
        "MaxStartups 200",  # mpirun and a deploy open many sessions at once
        "MaxSessions 200",
        # A session whose client vanished while this host's link was down (a lost board) ends
        # soon after the link is back, as on a board configured for recovery (docs/recovery.md).
        "ClientAliveInterval 2",
        "ClientAliveCountMax 3",
        "Subsystem sftp internal-sftp",
        *extra,
        "",
    ])


def start(c: Cluster, h: Host, board: Path | None = None) -> None:
    """Start the host's sshd in its namespace; an emulated board's (``h.arch``, its files in
    ``board``) in the board's own namespaces too (:func:`~.arm_board.namespace_argv`)."""
    from ...backend.engine import mpi_prefix

    folder = Path(c.state_dir) / "hosts" / h.name
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    (folder / "sshd.pid").unlink(missing_ok=True)
    pin = ["taskset", "-c", h.cores] if h.cores else []
    # setsid -f: sshd is nobody's child here (init reaps it), so no zombies after `down`.
    # The shell is a constant; the host name reaches it as "$1", never inside the script.
    if h.arch:
        if board is None:
            raise AutodiceError(f"cluster: {h.name} is an {h.arch} board: its files are needed")
        inside = [*pin, *namespace_argv(board, str(mpi_prefix()), h.name)]
    else:
        inside = ["unshare", "--uts", "--", "sh", "-c", 'hostname "$1" && shift && exec "$@"',
                  "sh", h.name, *pin]
    cmd = ["setsid", "-f", "ip", "netns", "exec", h.netns, *inside,
           "/usr/sbin/sshd", "-D", "-f", str(folder / "sshd_config"),
           "-E", str(folder / "sshd.log")]
    subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)


def wait(c: Cluster, h: Host, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((h.address, 22), timeout=1):
                if alive_pid(c, h) is not None:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    log = Path(c.state_dir) / "hosts" / h.name / "sshd.log"
    tail = log.read_text().strip().splitlines()[-3:] if log.exists() else []
    raise AutodiceError(f"cluster: sshd of {h.name} ({h.address}) did not come up", *tail)


def alive_pid(c: Cluster, h: Host) -> int | None:
    """The pid of this host's sshd if it is alive (checked against its command line)."""
    pid_file = Path(c.state_dir) / "hosts" / h.name / "sshd.pid"
    try:
        pid = int(pid_file.read_text().split()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return None
    # sshd rewrites its title ("sshd: /usr/sbin/sshd -D -f CONFIG ... [listener]"), so search.
    config = str(Path(c.state_dir) / "hosts" / h.name / "sshd_config").encode()
    return pid if config in cmdline and process_state(pid) != "Z" else None


def process_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"
