"""What an emulated cluster is, as recorded in its state directory: its hosts and their links.

Clusters have names (``default`` unless ``--name`` says otherwise) and each its own state
directory, slot number, bridge, links, namespaces and subnet, so two can be up at once and a
test's or a script's own cluster never replaces or removes a user's.

Apart from :mod:`.cluster` (which creates and removes them) so that :mod:`.sshd`, which
``cluster`` calls, can name these types without importing it back. :func:`inventory_toml` is the
inventory that reaches a cluster's hosts: deploy reads it as it reads a user's, and knows nothing
of emulation.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from ...core.errors import AutodiceError
from ..debian import DEFAULT_SUITE


@dataclass(frozen=True)
class Host:
    name: str
    netns: str
    veth: str  # the root namespace's end; the namespace's end is called eth0
    address: str
    cores: str  # taskset CPU list, "" for all
    remote_dir: str
    arch: str = ""  # uname -m of an emulated board of another architecture; "" for this machine's
    os: str = ""  # an emulated board's Debian release when not the default (bookworm)


@dataclass(frozen=True)
class Cluster:
    state_dir: str
    subnet: str
    gateway: str  # the bridge's address: this machine as seen from the hosts
    bandwidth: str  # tc rate, e.g. "1000000000bit"; "" when unshaped
    hosts: tuple[Host, ...]
    name: str = "default"
    slot: int = 0  # numbers its bridge, links and namespaces apart from other clusters'

    @property
    def bridge(self) -> str:
        return bridge_name(self.slot)

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


DEFAULT = "default"
_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
SLOTS = 250  # named clusters at once (a link name has 15 characters: adc250v99)


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise AutodiceError(f'--name "{name}": a cluster name is lower-case letters, digits '
                            'and "-" (at most 32)')
    return name


def state_dir(name: str = DEFAULT) -> Path:
    """``$AUTODICE_CLUSTER_DIR`` or ``/run/autodice-cluster`` (gone after a reboot, like netns)
    for the default cluster; the same with ``-<name>`` for a named one."""
    base = Path(os.environ.get("AUTODICE_CLUSTER_DIR") or "/run/autodice-cluster")
    return base if name == DEFAULT else base.with_name(f"{base.name}-{name}")


def load_state(name: str = DEFAULT) -> Cluster | None:
    return _load(state_dir(name) / "cluster.json")


def _load(path: Path) -> Cluster | None:
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        return Cluster(**{**data, "hosts": tuple(Host(**h) for h in data["hosts"])})
    except (ValueError, TypeError, KeyError):
        return None


def clusters() -> list[Cluster]:
    """Every cluster recorded on this machine (the default one and the named ones)."""
    base = state_dir()
    found = [_load(d / "cluster.json") for d in sorted(base.parent.glob(f"{base.name}*"))
             if d == base or d.name.startswith(f"{base.name}-")] if base.parent.is_dir() else []
    return [c for c in found if c is not None]


# Interface names: the default cluster's are those of the releases before names (adcbr0,
# adcv<i>, adc-<host>), so a cluster they brought up is still this one's to repair or remove.
def bridge_name(slot: int) -> str:
    return f"adcbr{slot}"


def veth_name(slot: int, i: int) -> str:
    return f"adcv{i}" if slot == 0 else f"adc{slot}v{i}"


def netns_prefix(slot: int) -> str:
    return "adc-" if slot == 0 else f"adc{slot}-"


def default_subnet(slot: int) -> str:
    return f"10.77.{slot}.0/24"


def slot_for(name: str, taken_links: set[str] = frozenset()) -> int:
    """The number of cluster ``name``: its recorded one, 0 for the default cluster, else the
    lowest that no other recorded cluster has and whose bridge does not exist.

    Raises:
        AutodiceError: every slot is taken.
    """
    have = load_state(name)
    if have is not None:
        return have.slot
    if name == DEFAULT:
        return 0
    used = {c.slot for c in clusters()} | {0}
    free = next((k for k in range(1, SLOTS + 1)
                 if k not in used and bridge_name(k) not in taken_links), None)
    if free is None:
        raise AutodiceError(f"cluster {name}: {SLOTS} clusters are up; take one down first")
    return free


def save_state(c: Cluster) -> None:
    root = Path(c.state_dir)
    root.mkdir(parents=True, exist_ok=True)
    (root / "cluster.json").write_text(json.dumps(asdict(c), indent=1, sort_keys=True) + "\n")


FILESYSTEM = "autodice-cluster"  # the label for "these hosts share one filesystem"


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string of printable text is a TOML basic string


def find_ncnn() -> Path | None:
    """An ncnn install this machine already has (no build): the override, else the cached one."""
    from ...backend.engine import CONFIG, cache_key, cache_root, ncnn_flags

    override = os.environ.get("AUTODICE_NCNN_DIR")
    if override:
        return Path(override)
    prefix = cache_root() / "ncnn" / cache_key(ncnn_flags(vulkan=True)) / "install"
    return prefix if (prefix / CONFIG).is_file() else None


def inventory_toml(c: Cluster, hosts: list[str] | None = None,
                   ncnn_dir: str | Path | None = None) -> str:
    """The inventory for ``autodice deploy`` to reach ``hosts`` (default: all) of ``c``."""
    from ...backend.engine import mpi_prefix

    ncnn = Path(ncnn_dir) if ncnn_dir else find_ncnn()
    lines = [
        "# Inventory for `autodice deploy`, written by `autodice cluster up` (emulated hosts).",
        f"network = {_toml_str(c.subnet)}  # MPI traffic stays on this subnet",
        "",
        "[defaults]",
        'user = "root"',
        "port = 22",
        f"identity = {_toml_str(str(c.identity))}",
        f"known_hosts = {_toml_str(str(c.known_hosts))}",
        f"filesystem = {_toml_str(FILESYSTEM)}  # shared: one build per architecture",
        f"mpi_prefix = {_toml_str(str(mpi_prefix()))}",
    ]
    for h in c.hosts:
        if hosts is not None and h.name not in hosts:
            continue
        lines += ["", f"[hosts.{h.name}]", f"address = {_toml_str(h.address)}",
                  f"remote_dir = {_toml_str(h.remote_dir)}"]
        if h.arch:  # an emulated board: its program is cross-built here, with ncnn
            lines.append(f"# an emulated {h.arch} board ({h.os or DEFAULT_SUITE}): no compiler, "
                         "ncnn built here for it")
        elif ncnn:
            lines.append(f"ncnn_dir = {_toml_str(str(ncnn))}")
    return "\n".join(lines) + "\n"
