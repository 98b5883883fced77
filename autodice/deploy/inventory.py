"""``inventory.toml``: how ``autodice deploy`` reaches each host of the platform.

::

    network = "10.77.0.0/24"      # optional: MPI traffic stays on this subnet

    [defaults]                    # optional: any host key, applied to every host
    user = "root"
    identity = "~/.ssh/id_ed25519"
    known_hosts = "~/.ssh/known_hosts"

    [hosts.edge01]
    address = "192.168.1.11"
    remote_dir = "/home/root/autodice"
    mpi_prefix = "/usr"           # optional: else mpirun/mpicxx from the remote PATH
    ncnn_dir = "/opt/ncnn"        # optional: else deploy builds ncnn there once
    build = "head"                # optional: cross-build here (another arch) or "board"

Checked against the plan before any network use: every host of the plan present, no extras, and
every value usable (one error per offender, naming the file and host). Remote directories must be
absolute, plain paths: every remote path deploy touches is inside one, and none of them needs
quoting on the remote shell or in Open MPI's ssh command line.
"""

from __future__ import annotations

import getpass
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import AutodiceError, Problems, did_you_mean, parse_nested, read_text

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib  # type: ignore[no-redef]

# host key -> help, for errors that list what is allowed.
KEYS = {
    "address": "IP address or DNS name (required)",
    "remote_dir": "absolute directory on the host that deploy owns (required)",
    "user": "ssh login (default: your user name)",
    "port": "ssh port (default 22)",
    "identity": "private key file (default: ssh's own choice)",
    "known_hosts": "known_hosts file to check host keys against (default: ssh's)",
    "mpi_prefix": "Open MPI install prefix on the host (default: the remote PATH)",
    "ncnn_dir": "ncnn install prefix on the host (default: build ncnn there)",
    "filesystem": "label shared by hosts on one filesystem: they share one build per arch",
    "build": '"head" (cross-build here and ship) or "board" (build there); default: head '
             "for a board of another architecture when its cross compiler is installed here",
}
BUILDS = ("head", "board")
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9._+@/-]*")
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
_ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:-]*")


@dataclass(frozen=True)
class Target:
    """One host as deploy reaches it."""

    host: str  # the platform's name
    address: str
    user: str
    port: int
    remote_dir: str
    identity: str | None = None  # local paths, resolved
    known_hosts: str | None = None
    mpi_prefix: str | None = None  # paths on the host
    ncnn_dir: str | None = None
    filesystem: str | None = None
    build: str | None = None  # "head" | "board" | None: chosen by deploy

    def where(self) -> str:
        return f"{self.host} ({self.user}@{self.address}:{self.port})"


@dataclass(frozen=True)
class Inventory:
    path: str
    network: str | None
    targets: dict[str, Target]  # in the plan's host order


def load_inventory(path: str | Path, plan_hosts: list[str] | None = None) -> Inventory:
    """Parse and check ``path``; with ``plan_hosts``, also that it covers those hosts.

    Raises:
        AutodiceError: unreadable TOML, unknown keys, bad values, missing local key files, a
            plan host without an entry (one line each, all at once).
    """
    path = Path(path)
    where = str(path)
    try:
        data = parse_nested(tomllib.loads, read_text(path), path)
    except tomllib.TOMLDecodeError as e:
        raise AutodiceError(f"{where}: not valid TOML ({e})") from None
    problems = Problems()
    for key in data:
        if key not in ("network", "defaults", "hosts"):
            problems.add(f'{where}: unknown top-level key "{key}"'
                         f'{did_you_mean(key, ["network", "defaults", "hosts"])} '
                         "(allowed: network, [defaults], [hosts.NAME])")
    network = data.get("network")
    if network is not None:
        try:
            network = str(ipaddress.ip_network(str(network), strict=False))
        except ValueError:
            problems.add(f'{where}: network = "{network}" is not a subnet like 10.77.0.0/24')
            network = None
    defaults = data.get("defaults", {})
    hosts = data.get("hosts", {})
    if not isinstance(defaults, dict) or not isinstance(hosts, dict):
        raise AutodiceError(f"{where}: [defaults] and [hosts.NAME] must be tables")
    _unknown_keys(defaults, f"{where}: [defaults]", problems)
    targets: dict[str, Target] = {}
    for name, table in hosts.items():
        if not isinstance(table, dict):
            problems.add(f"{where}: hosts.{name} must be a table ([hosts.{name}])")
            continue
        _unknown_keys(table, f"{where}: host {name}", problems)
        target = _target(name, {**defaults, **table}, path.parent, f"{where}: host {name}",
                         problems)
        if target is not None:
            targets[name] = target
    if plan_hosts is not None:
        # Hosts the plan does not use are fine (a plan may use some boards of the cluster);
        # a misspelt entry shows up as the plan host it was meant for.
        spare = [name for name in hosts if name not in plan_hosts]
        for name in plan_hosts:
            if name not in hosts:
                problems.add(f"{where}: host {name} of the plan has no [hosts.{name}] entry "
                             f"(address, remote_dir){did_you_mean(name, spare)}")
    seen: dict[str, str] = {}
    for t in targets.values():
        if t.address in seen:
            problems.add(f"{where}: host {t.host} has the same address as {seen[t.address]}; "
                         "mpirun tells hosts apart by address")
        seen[t.address] = t.host
    problems.raise_if_any()
    order = plan_hosts if plan_hosts is not None else list(targets)
    return Inventory(where, network, {h: targets[h] for h in order})


def _unknown_keys(table: dict, where: str, problems: Problems) -> None:
    for key in table:
        if key not in KEYS:
            allowed = ", ".join(f"{k} ({h})" for k, h in KEYS.items())
            problems.add(f'{where}: unknown key "{key}"{did_you_mean(key, KEYS)}; '
                         f"allowed: {allowed}")


def _target(name: str, t: dict, base: Path, where: str, problems: Problems) -> Target | None:
    bad = len(problems.items)
    if not _PLAIN_NAME.fullmatch(name):
        problems.add(f'{where}: the name must be letters, digits, ".", "_" or "-"')
    for key in ("address", "remote_dir"):
        if key not in t:
            problems.add(f"{where}: {key} is missing ({KEYS[key]})")
    address = str(t.get("address", ""))
    if address and not _ADDRESS.fullmatch(address):
        problems.add(f'{where}: address "{address}" is not a host name or IP address')
    user = str(t.get("user") or getpass.getuser())
    if not _PLAIN_NAME.fullmatch(user):
        problems.add(f'{where}: user "{user}" must be letters, digits, ".", "_" or "-"')
    port = t.get("port", 22)
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        problems.add(f"{where}: port {port!r} must be a number from 1 to 65535")
    remote: dict[str, str | None] = {}
    for key in ("remote_dir", "mpi_prefix", "ncnn_dir"):
        value = t.get(key)
        if value is None:
            remote[key] = None
            continue
        value = str(value)
        if not _PLAIN_PATH.fullmatch(value) or "/../" in value + "/" or "/./" in value + "/":
            problems.add(f'{where}: {key} "{value}" must be an absolute path of letters, '
                         'digits and "._+@-" (no "..", spaces or quotes)')
        elif key == "remote_dir" and value.rstrip("/").count("/") < 2:
            problems.add(f'{where}: remote_dir "{value}" is too close to / (deploy deletes '
                         "files inside it); use a directory of its own, e.g. /home/USER/autodice")
        remote[key] = value.rstrip("/") or "/"
    local: dict[str, str | None] = {}
    for key in ("identity", "known_hosts"):
        value = t.get(key)
        if value is None:
            local[key] = None
            continue
        file = (base / Path(str(value)).expanduser()).resolve()
        if not file.is_file():
            problems.add(f"{where}: {key} {file} does not exist")
        elif re.search(r"\s", str(file)):
            problems.add(f"{where}: {key} {file}: paths with spaces are not supported")
        local[key] = str(file)
    filesystem = t.get("filesystem")
    build = t.get("build")
    if build is not None and build not in BUILDS:
        problems.add(f'{where}: build = {build!r} must be "head" or "board"')
    if len(problems.items) > bad:
        return None
    return Target(host=name, address=address, user=user, port=port,
                  remote_dir=str(remote["remote_dir"]), identity=local["identity"],
                  known_hosts=local["known_hosts"], mpi_prefix=remote["mpi_prefix"],
                  ncnn_dir=remote["ncnn_dir"],
                  filesystem=str(filesystem) if filesystem is not None else None, build=build)
