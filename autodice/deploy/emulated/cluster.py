"""``autodice cluster up|down|status``: an emulated edge cluster on this machine, to deploy to.

Each host is a network namespace hanging off one Linux bridge by a veth pair, with its own
address, its own ``/etc/hosts`` (``ip netns exec`` bind-mounts ``/etc/netns/<ns>/hosts``), its own
hostname (a UTS namespace, so ranks name their host in messages) and its own sshd, started under
``taskset`` when the host gets a CPU set (everything a login spawns inherits it). Each link is
shaped with ``tbf`` in both directions (``netem`` is not available here, so: bandwidth only).
The bridge gets the subnet's first address, so this machine reaches every host like a laptop on
the boards' switch, and ``deploy`` runs from here unchanged.

Each host also gets its own home directory, as a board has: root's home in the namespace's own
``/etc/passwd`` (bind-mounted the same way) is ``<state>/hosts/<name>/home``. Otherwise every
ssh command on a host would run this machine's ``~/.bashrc``, which bash reads for commands
run by sshd (on the machine this was written on, ``pyenv init``: 0.2 s of CPU per command, 20x
the command itself), and a redeploy's time would be mostly someone else's shell setup.

Everything the cluster creates is named with the ``adc`` prefix and recorded in a state
directory (``$AUTODICE_CLUSTER_DIR`` or ``/run/autodice-cluster``) *before* it is created, so
``down`` removes all of it even after an ``up`` that failed half-way. Keys, known_hosts, sshd
configs and each host's remote directory live under that directory too: ``down`` deletes it.
Hosts share this machine's filesystem, so each gets a distinct remote directory and a deploy
really copies.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from ...core.errors import AutodiceError, Problems
from ...core.spec import parse_cores, parse_rate
from ..debian import DEFAULT_SUITE
from . import sshd
from .arm_board import board_root, check_arch, emulated, missing_tools
from .state import (
    DEFAULT,
    Cluster,
    Host,
    HostStatus,
    bridge_name,
    check_name,
    default_subnet,
    inventory_toml,
    load_state,
    netns_prefix,
    save_state,
    slot_for,
    state_dir,
    veth_name,
)

SSH_PACKAGES = ("openssh-server", "rsync")
_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,62}")


# --- up ---------------------------------------------------------------------------------------


def plan_cluster(hosts: list[str], bandwidth: str | None = "1gbit",
                 cores: dict[str, str] | None = None, subnet: str | None = None,
                 root: Path | None = None, arch: dict[str, str] | None = None,
                 name: str = DEFAULT, slot: int = 0) -> Cluster:
    """The cluster ``up`` would make: names, addresses, rates. Checks every argument at once.

    Args:
        hosts: host names (they become the platform's host names: edge01, edge02, ...).
        bandwidth: per-link rate in platform.txt units (``1gbit``, ``100MB/s``); None: unshaped.
        cores: host -> CPU list (``0-1``, ``2,3``) its sshd and everything it starts run on.
        subnet: an IPv4 network with room for the bridge and every host (default
            ``10.77.<slot>.0/24``).
        arch: host -> ``uname -m`` of an emulated board of another architecture (``aarch64``;
            :mod:`.arm_board`); the others are this machine's kind.
    Raises:
        AutodiceError: a bad host name, duplicate, rate, CPU list, architecture or subnet.
    """
    root = Path(root or state_dir(name))
    subnet = subnet or default_subnet(slot)
    problems = Problems()
    for host in hosts:
        if not _HOST_NAME.fullmatch(host):
            problems.add(f'--hosts: "{host}" is not a host name (letters, digits, "-")')
    for host in {h for h in hosts if hosts.count(h) > 1}:
        problems.add(f'--hosts: "{host}" is given twice')
    if not hosts:
        problems.add("--hosts: give at least one host name")
    rate = ""
    if bandwidth:
        try:
            rate = f"{round(parse_rate(bandwidth) * 8)}bit"
            if rate == "0bit":  # tc would refuse it after the namespaces exist
                raise ValueError("must be more than 0")
        except ValueError as e:
            problems.add(f"--bandwidth {bandwidth}: {e} (e.g. 1gbit, 100mbit, 50MB/s)")
    cores = dict(cores or {})
    n_cpus = os.cpu_count() or 1
    for host, text in cores.items():
        if host not in hosts:
            problems.add(f'--cores {host}={text}: "{host}" is not one of --hosts')
            continue
        try:
            bad = [c for c in parse_cores(text) if c >= n_cpus]
        except ValueError as e:
            problems.add(f"--cores {host}={text}: {e}")
            continue
        if bad:
            problems.add(f"--cores {host}={text}: this machine has cores 0-{n_cpus - 1}")
    arches = {}
    for host, text in (arch or {}).items():
        if host not in hosts:
            problems.add(f'--arch {host}={text}: "{host}" is not one of --hosts')
            continue
        try:
            arches[host] = check_arch(text)  # (uname -m, Debian release)
        except AutodiceError as e:
            problems.add(f"--arch {host}={text}: {e.problems[0]}")
    try:
        net = ipaddress.IPv4Network(subnet)
        if net.num_addresses < len(hosts) + 12:
            problems.add(f"--subnet {subnet}: too small for {len(hosts)} hosts")
    except ValueError as e:
        problems.add(f"--subnet {subnet}: {e}")
        net = None
    problems.raise_if_any()
    assert net is not None
    base = net.network_address
    return Cluster(
        state_dir=str(root), subnet=str(net), gateway=str(base + 1), bandwidth=rate,
        hosts=tuple(Host(name=h, netns=netns_prefix(slot) + h, veth=veth_name(slot, i),
                         address=str(base + 11 + i), cores=cores.get(h, ""),
                         remote_dir=str(root / "hosts" / h / "work"),
                         arch=arches[h][0] if h in arches and emulated(arches[h][0]) else "",
                         os=arches[h][1] if h in arches else "")
                    for i, h in enumerate(hosts)), name=name, slot=slot)


def up(hosts: list[str], bandwidth: str | None = "1gbit", cores: dict[str, str] | None = None,
       subnet: str | None = None, inventory: str | Path | None = None,
       ncnn_dir: str | Path | None = None, console=None,
       arch: dict[str, str] | None = None, name: str = DEFAULT,
       replace: bool = False) -> Cluster:
    """Create cluster ``name``, or repair it when it already exists with the same settings.

    Idempotent: the same call again only restarts sshds that died and rewrites the inventory.
    A cluster of that name with other settings is someone's: it is refused, unless ``replace``.
    Other clusters are never touched (tests and scripts bring up one of their own name).

    Args:
        subnet: default ``10.77.<slot>.0/24``: the default cluster's is 10.77.0.0/24.
        inventory: where to write the inventory for ``autodice deploy`` (a copy always goes to
            the state directory).
        ncnn_dir: the ncnn install the hosts build against (default: ``$AUTODICE_NCNN_DIR``, else
            a cached build, if any).
    Raises:
        AutodiceError: not root, tools missing and not installable, a bad argument, the name
            taken by a cluster of other settings, or a step that failed (everything created so
            far is removed again).
    """
    check_name(name)
    plan_cluster(hosts, bandwidth, cores, subnet, arch=arch, name=name)  # bad options first
    require_root("cluster up")
    links = set(os.listdir("/sys/class/net")) if Path("/sys/class/net").is_dir() else set()
    want = plan_cluster(hosts, bandwidth, cores, subnet, arch=arch, name=name,
                        slot=slot_for(name, links))
    have = load_state(name)
    if have is not None and have != want and not replace:
        flag = "" if name == DEFAULT else f" --name {name}"
        raise AutodiceError(
            f"cluster {name} is up with other settings ({describe(have)}): leave it to whoever "
            f"brought it up, give another --name, or replace it (`autodice cluster down{flag}` "
            "first, or --replace)")
    if have is not None and (have != want or not all(_netns_exists(h.netns) for h in have.hosts)):
        down(name)  # replaced, or a namespace went missing: start over
        have = None
    elif have is None and (_link_exists(want.bridge) or _our_namespaces(want.slot)):
        down(name)  # leftovers of an up that died before recording its state
    _ensure_tools(console, any(h.arch for h in want.hosts))
    boards = {h.name: board_root(h.os or DEFAULT_SUITE, console) for h in want.hosts if h.arch}
    root = Path(want.state_dir)
    try:
        if have is None:
            _conflicts(want)
            save_state(want)  # first: `down` must know what to remove if anything below fails
            _create_network(want)
            sshd.create_keys(want, boards)
        for host in want.hosts:
            if sshd.alive_pid(want, host) is None:
                sshd.start(want, host, boards.get(host.name))
        for host in want.hosts:
            sshd.wait(want, host)
    except BaseException:
        if have is None:
            down(name)
        raise
    text = inventory_toml(want, ncnn_dir=ncnn_dir)
    (root / "inventory.toml").write_text(text)
    if inventory:
        Path(inventory).write_text(text)
    return want


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise AutodiceError(f"{what} needs root (network namespaces, veth links, a bridge, "
                            "sshd): run it as root, e.g. `sudo autodice cluster up ...`")


def _ensure_tools(console, boards: bool = False) -> None:
    """ip, tc, unshare, taskset, sshd, ssh-keygen, rsync; installs openssh-server, rsync, and
    with ``boards`` (emulated boards of another architecture) qemu-user-static."""
    missing = [p for p, exe in (("openssh-server", "/usr/sbin/sshd"), ("rsync", "rsync"))
               if not (Path(exe).exists() if exe.startswith("/") else shutil.which(exe))]
    missing += missing_tools() if boards else []
    if missing and shutil.which("apt-get"):
        if console is not None:
            console.print(f"installing {' '.join(missing)} (apt-get)")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *missing]):
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
                raise AutodiceError(f"{' '.join(cmd)} failed:", *tail)
    tools = {"ip": "iproute2", "tc": "iproute2", "unshare": "util-linux",
             "taskset": "util-linux", "ssh-keygen": "openssh-client", "ssh": "openssh-client",
             "rsync": "rsync"}
    problems = Problems()
    for tool, package in tools.items():
        if shutil.which(tool) is None:
            problems.add(f"cluster: {tool} is missing (apt-get install {package})")
    if not Path("/usr/sbin/sshd").exists():
        problems.add("cluster: /usr/sbin/sshd is missing (apt-get install openssh-server)")
    problems.raise_if_any()


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AutodiceError(f"cluster: `{' '.join(cmd)}` failed: "
                            f"{(proc.stderr or proc.stdout).strip()}")
    return proc


def _conflicts(c: Cluster) -> None:
    """Refuse a subnet that an interface of this machine already routes (someone else's)."""
    net = ipaddress.IPv4Network(c.subnet)
    for line in _run("ip", "-o", "-4", "addr", "show").stdout.splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[1] != c.bridge:
            addr = ipaddress.IPv4Interface(parts[3])
            if addr.network.overlaps(net):
                raise AutodiceError(f"--subnet {c.subnet}: overlaps {addr} on {parts[1]}; "
                                    "choose another --subnet")


def _create_network(c: Cluster) -> None:
    prefix = ipaddress.IPv4Network(c.subnet).prefixlen
    _run("ip", "link", "add", c.bridge, "type", "bridge")
    _run("ip", "addr", "add", f"{c.gateway}/{prefix}", "dev", c.bridge)
    _run("ip", "link", "set", c.bridge, "up")
    hosts_file = "127.0.0.1 localhost\n" + "".join(
        f"{h.address} {h.name}\n" for h in c.hosts)
    for h in c.hosts:
        _run("ip", "netns", "add", h.netns)
        _run("ip", "link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "netns",
             h.netns)
        _run("ip", "link", "set", h.veth, "master", c.bridge)
        _run("ip", "link", "set", h.veth, "up")
        ns = ("ip", "netns", "exec", h.netns)
        _run(*ns, "ip", "link", "set", "lo", "up")
        _run(*ns, "ip", "addr", "add", f"{h.address}/{prefix}", "dev", "eth0")
        _run(*ns, "ip", "link", "set", "eth0", "up")
        if h.arch:  # a board's sshd runs in a user namespace of its own: port 22 must be open
            _run(*ns, "sysctl", "-q", "-w", "net.ipv4.ip_unprivileged_port_start=22")
        if c.bandwidth:
            # Both directions: out of the host (its eth0) and into it (the bridge's veth end).
            # The burst covers a few 64 KiB GSO segments, else tbf drops them whole.
            for dev_cmd in ((*ns, "tc"), ("tc",)):
                dev = "eth0" if len(dev_cmd) > 1 else h.veth
                _run(*dev_cmd, "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                     c.bandwidth, "burst", "256kb", "latency", "50ms")
        etc = Path("/etc/netns") / h.netns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(hosts_file)
        home = Path(c.state_dir) / "hosts" / h.name / "home"
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        (etc / "passwd").write_text(_passwd(Path("/etc/passwd").read_text(), home,
                                            "/bin/sh" if h.arch else None))
        (Path(h.remote_dir)).mkdir(parents=True, exist_ok=True)


def _passwd(text: str, home: Path, shell: str | None = None) -> str:
    """``/etc/passwd`` with root's home directory moved to ``home`` (the user deploy logs in
    as on the emulated hosts), and its login shell ``shell`` (a board's own: its busybox sh)."""
    lines = []
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) == 7 and fields[2] == "0":
            fields[5] = str(home)
            fields[6] = shell or fields[6]
        lines.append(":".join(fields))
    return "\n".join(lines) + "\n"


def _netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


# --- down / status ----------------------------------------------------------------------------


def netns_pids(netns: str) -> list[int]:
    """Processes living in a namespace (``ip netns pids``)."""
    proc = _run("ip", "netns", "pids", netns, check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def describe(c: Cluster) -> str:
    """``hosts edge01, edge02; 10.77.0.0/24; 1gbit``: what a cluster is, in a message."""
    rate = f"{int(c.bandwidth[:-3]) / 1e9:g}gbit" if c.bandwidth else "unshaped"
    return f"hosts {', '.join(h.name for h in c.hosts)}; {c.subnet}; {rate}"


def down(name: str = DEFAULT) -> list[str]:
    """Remove every namespace, link, process and file cluster ``name``'s ``up`` created;
    returns what went. Other clusters stay as they are.

    Works from the state file, and also sweeps the namespaces of the cluster's prefix, its
    bridge and ``/etc/netns`` entries, so a lost state file leaves nothing behind either (for
    a named cluster, whose number only the state file knows, the state directory alone).
    """
    require_root("cluster down")
    check_name(name)
    c = load_state(name)
    slot = c.slot if c is not None else (0 if name == DEFAULT else None)
    removed: list[str] = []
    names = {h.netns for h in c.hosts} if c else set()
    names |= set(_our_namespaces(slot)) if slot is not None else set()
    for ns in sorted(names):
        # Everything inside one of our namespaces is ours: its sshd, logins, ranks.
        pids = netns_pids(ns)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 2
            while (pids := [p for p in pids if Path(f"/proc/{p}").exists()
                            and sshd.process_state(p) != "Z"]) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not pids:
                break
        if _netns_exists(ns):
            _wait_for_goodbyes(ns)
            _run("ip", "netns", "del", ns, check=False)
            removed.append(f"namespace {ns}")
        etc = Path("/etc/netns") / ns
        if etc.exists():
            shutil.rmtree(etc, ignore_errors=True)
            removed.append(f"{etc}")
    if c:
        for h in c.hosts:  # a veth goes with its namespace; this catches one left half-made
            if _link_exists(h.veth):
                _run("ip", "link", "del", h.veth, check=False)
                removed.append(f"link {h.veth}")
    try:
        Path("/etc/netns").rmdir()  # only if empty: another tool's entries stay
    except OSError:
        pass
    bridge = bridge_name(slot) if slot is not None else None
    if bridge is not None and _link_exists(bridge):
        _run("ip", "link", "del", bridge, check=False)
        removed.append(f"bridge {bridge}")
    root = state_dir(name)
    if root.exists():
        shutil.rmtree(root, ignore_errors=True)
        removed.append(str(root))
    return removed


def _wait_for_goodbyes(ns: str, timeout_s: float = 1.0) -> None:
    """Wait until the peers of the namespace's TCP connections have seen them close (no socket
    left established or waiting for the ACK of its FIN), so that an ssh master connection open
    to the host ends now, rather than when its keep-alives give up, some 15 s after the
    namespace and its links are gone."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        tcp = _run("ip", "netns", "exec", ns, "cat", "/proc/net/tcp", "/proc/net/tcp6",
                   check=False).stdout
        # st: 01 established, 04 fin-wait-1, 09 last-ack, 0B closing
        if not any(line.split()[3] in ("01", "04", "09", "0B")
                   for line in tcp.splitlines()[1:] if len(line.split()) > 3
                   and line.split()[0].endswith(":")):
            return
        time.sleep(0.02)


def _our_namespaces(slot: int) -> list[str]:
    listed = _run("ip", "netns", "list", check=False).stdout.splitlines()
    return [line.split()[0] for line in listed if line.startswith(netns_prefix(slot))]


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def status(name: str = DEFAULT) -> tuple[Cluster | None, list[HostStatus]]:
    """The recorded cluster and, per host, whether its namespace and sshd are alive."""
    c = load_state(check_name(name))
    if c is None:
        return None, []
    return c, [HostStatus(h.name, h.address, h.cores, _netns_exists(h.netns), sshd.alive_pid(c, h),
                          f"{h.arch}:{h.os}" if h.os else h.arch) for h in c.hosts]


def stop_sshd(host_name: str, name: str = DEFAULT) -> None:
    """Stop one host's sshd and the sessions it serves, ssh connections open to it included
    (a board that went away); ``up`` starts it again."""
    c = load_state(name)
    host = next((h for h in c.hosts if h.name == host_name), None) if c else None
    if host is None:
        raise AutodiceError(f"cluster {name}: no host {host_name} (run `autodice cluster "
                            "status`)")
    pid = sshd.alive_pid(c, host)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        for other in netns_pids(host.netns):  # the sessions: what the board took with it
            try:
                os.kill(other, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        while sshd.alive_pid(c, host) is not None and time.monotonic() < deadline:
            time.sleep(0.02)
