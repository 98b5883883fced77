"""What an emulated cluster is, as recorded in its state directory: its hosts and their links.

Apart from :mod:`.cluster` (which creates and removes them) so that :mod:`.sshd` and
:mod:`.inventory`, which ``cluster`` calls, can name these types without importing it back.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Host:
    name: str
    netns: str
    veth: str  # the root namespace's end; the namespace's end is called eth0
    address: str
    cores: str  # taskset CPU list, "" for all
    remote_dir: str
    arch: str = ""  # uname -m of an emulated board of another architecture; "" for this machine's


@dataclass(frozen=True)
class Cluster:
    state_dir: str
    subnet: str
    gateway: str  # the bridge's address: this machine as seen from the hosts
    bandwidth: str  # tc rate, e.g. "1000000000bit"; "" when unshaped
    hosts: tuple[Host, ...]

    @property
    def identity(self) -> Path:
        return Path(self.state_dir) / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return Path(self.state_dir) / "known_hosts"


@dataclass(frozen=True)
class HostStatus:
    name: str
    address: str
    cores: str
    netns: bool
    sshd_pid: int | None  # None when not running
    arch: str = ""


def state_dir() -> Path:
    """``$AUTODICE_CLUSTER_DIR`` or ``/run/autodice-cluster`` (gone after a reboot, like netns)."""
    return Path(os.environ.get("AUTODICE_CLUSTER_DIR") or "/run/autodice-cluster")


def load_state() -> Cluster | None:
    path = state_dir() / "cluster.json"
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        return Cluster(**{**data, "hosts": tuple(Host(**h) for h in data["hosts"])})
    except (ValueError, TypeError, KeyError):
        return None


def save_state(c: Cluster) -> None:
    root = Path(c.state_dir)
    root.mkdir(parents=True, exist_ok=True)
    (root / "cluster.json").write_text(json.dumps(asdict(c), indent=1, sort_keys=True) + "\n")
