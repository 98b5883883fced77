"""Bandwidth and latency of the links between a cluster's hosts, measured on the cluster.

``autodice profile --inventory`` replaces the platform's ``bandwidth``/``latency`` figures with
what the network really does between every pair of hosts, the way a rank sees it: one rank on
each host runs ``profile_layers --link`` (the ping-pong through ``autodice::Transfer`` that also
measures ``shm``), and :func:`~autodice.dse.profile.fit_link` turns its one-way times into a
:class:`~autodice.dse.profile.Link` (a poor fit is a warning, never a failure).

The tools get there as :func:`~.remote_tools.ship_tools` ships them (deploy's machinery), and
``mpirun`` is started on the pair's first host with Open MPI's ssh launcher and the inventory's
subnet.

Pairs are measured one after the other: two pairs that share a host would share its link and
each see a fraction of it. Nothing is cached: the numbers describe the network today, not the
model, so every ``--inventory`` measures again (a build is reused when nothing changed).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from ..core.errors import AutodiceError
from ..core.spec import parse_platform
from ..deploy.inventory import Inventory, load_inventory
from ..deploy.launch import MPIRUN_HUNG, check_launchable, mpirun_head, run_mpirun
from ..deploy.ssh import Host, Ssh, must, parallel, ssh_config
from .profile import Link, link_from_rows
from .remote_tools import TOOLS, ship_tools

# The ranks' environment. A slow link may take seconds per 4 MiB message: the runtime's hang
# detection (8 s by default) must not mistake that for a dead peer.
RANK_ENV = {"OMP_WAIT_POLICY": "passive", "AUTODICE_TIMEOUT_S": "120"}


def probe_links(inventory: str | Path | Inventory, console=None,
                platform: str | Path | None = None, timeout_s: float = 600) -> dict[str, Link]:
    """Measure the link between every pair of the inventory's hosts.

    Args:
        inventory: inventory.toml (see :mod:`autodice.deploy.inventory`), or one already loaded.
        console: a ``rich.console.Console`` for progress (stderr by default).
        platform: platform.txt; every inventory host must be one of its devices.
        timeout_s: the longest one pair's measurement may run before it is stopped.
    Returns:
        ``"a-b"`` (sorted host names joined by ``-``, as profile.json keys them) -> Link.
    Raises:
        AutodiceError: a bad inventory, hosts the platform does not have or fewer than two
            (before any network use); unreachable hosts or missing tools (all at once); a
            failed remote build (its log tail); a failed measurement (the pair named).
    """
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    check_hosts(inv, platform)
    check_launchable(inv)
    names = sorted(inv.targets)
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    console = console or Console(stderr=True)
    columns = (SpinnerColumn(), TextColumn("{task.fields[host]:<12}"),
               TextColumn("{task.description}"), TimeElapsedColumn())
    with tempfile.TemporaryDirectory(prefix="autodice-links-") as tmp, \
            Progress(*columns, console=console, transient=True) as bar:
        work = Path(tmp)
        tasks = {h: bar.add_task("waiting", host=h, total=None) for h in inv.targets}

        def progress(host: str, step: str) -> None:
            bar.update(tasks[host], description=step)

        hosts = {name: Host(t) for name, t in inv.targets.items()}
        ssh = Ssh(inv, work)
        try:
            ship_tools(ssh, list(hosts.values()), work, progress)
            heads = [hosts[n] for n in dict.fromkeys(a for a, _ in pairs)]
            _send_launch_files(ssh, inv, heads, pairs, work / "launch", progress)
            links = {}
            for k, (a, b) in enumerate(pairs, 1):
                for h in (a, b):
                    progress(h, f"measuring {a}-{b} ({k}/{len(pairs)})")
                links[f"{a}-{b}"] = measure_pair(ssh, inv, hosts[a], hosts[b], work, timeout_s,
                                                  lambda m: console.print(f"warning: {m}"))
                for h in (a, b):
                    progress(h, "measured")
        finally:
            ssh.close(inv.targets.values())
    return links


def check_hosts(inv: Inventory, platform: str | Path | None) -> None:
    """At least two hosts, and (given a platform) every one of them a device of it."""
    problems = []
    if platform is not None:
        spec = parse_platform(platform)
        known = list(spec.devices)
        for name in inv.targets:
            if name not in spec.devices:
                problems.append(f"{inv.path}: host {name} is not in {platform} "
                                f"(hosts: {', '.join(known)})")
    if len(inv.targets) < 2:
        problems.append(f"{inv.path}: {len(inv.targets)} host(s); measuring links needs at "
                        "least two")
    if problems:
        raise AutodiceError(*problems)


def _send_launch_files(ssh: Ssh, inv: Inventory, heads: list[Host],
                       pairs: list[tuple[str, str]], folder: Path, progress) -> None:
    """The ssh config mpirun uses and one hostfile per pair, onto every host that heads one."""
    folder.mkdir()
    (folder / "ssh_config").write_text(ssh_config(inv.targets.values(), by="address"))
    for a, b in pairs:
        (folder / f"hostfile-{a}-{b}").write_text(
            f"{inv.targets[a].address} slots=1\n{inv.targets[b].address} slots=1\n")

    def send(h: Host) -> None:
        must(["rsync", "-rpc", "--delete", "-e", ssh.rsh(), f"{folder}/",
              f"{h.target.host}:{TOOLS.root(h)}/launch/"], "sending the launch files failed")

    problems = parallel(heads, "launch files", send, progress)
    if problems:
        raise AutodiceError(*problems)


def pair_argv(inv: Inventory, a: Host, b: Host, out: str) -> list[str]:
    """The mpirun command ``a`` runs: rank 0 there, rank 1 on ``b``, each its own binary."""
    launch = f"{TOOLS.root(a)}/launch"
    argv = mpirun_head(inv, a, RANK_ENV, f"{launch}/hostfile-{a.target.host}-{b.target.host}",
                       TOOLS)
    argv += ["--map-by", ":OVERSUBSCRIBE", "--bind-to", "none"]
    for rank, h in enumerate((a, b)):
        argv += [":"] if rank else []
        argv += ["-np", "1", "--wdir", TOOLS.root(h), "--host", h.target.address,
                 TOOLS.binary(h), "--link", out]
    return argv


def measure_pair(ssh: Ssh, inv: Inventory, a: Host, b: Host, work: Path,
                 timeout_s: float, warn) -> Link:
    """One ping-pong between ``a`` and ``b``, launched from ``a``; its rows fitted to a Link
    (``warn`` gets the fit's warning, if any)."""
    pair = f"{a.target.host}-{b.target.host}"
    out = f"{TOOLS.root(a)}/results/link-{pair}.json"
    must(ssh.cmd(a.target, "rm", "-f", out), f"{a.target.where()}: cannot clear {out}")
    log = work / f"link-{pair}.log"
    code, timed_out, _ = run_mpirun(ssh, [a, b], pair_argv(inv, a, b, out), log, timeout_s,
                                    TOOLS)
    between = f"link {pair}: between {a.target.where()} and {b.target.where()}"
    if timed_out:
        raise AutodiceError(f"{between}: profile_layers --link ran past {timeout_s:.0f} s and "
                            "was stopped")
    if code not in (0, MPIRUN_HUNG):  # (after a hang, the measurement's file says)
        said = [ln for ln in log.read_text(errors="replace").splitlines()
                if ln.strip() and "setpgid" not in ln]
        raise AutodiceError(f"{between}: profile_layers --link failed (exit {code}):",
                            *said[-8:])
    proc = subprocess.run(ssh.cmd(a.target, "cat", out), capture_output=True, text=True,
                          timeout=60, check=False)
    try:
        rows = json.loads(proc.stdout)["rows"]
    except (ValueError, KeyError, TypeError):
        raise AutodiceError(f"{between}: {a.target.host}:{out} is missing or not the "
                            "profiler's JSON") from None
    link, warning = link_from_rows(rows)
    if warning:
        warn(f"link {pair}: {warning}")
    return link


