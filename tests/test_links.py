"""``autodice profile --inventory``: the links between hosts, measured on the emulated cluster.

Every host's link is shaped with tc tbf at 200 Mbit/s (25 MB/s) both ways, so a message between
two hosts crosses two 25 MB/s buckets; TCP/IP headers take ~4 % of that. One cluster of three
hosts serves the module; the profiler is built on one host and copied to the others (they share
this machine's filesystem, and the inventory points them at the lean ncnn already built here, so
no ncnn is built). Needs root, like tests/test_cluster.py.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import TEST_CLUSTER
from emulated import write_inventory

from autodice.cli import main
from autodice.deploy.emulated import cluster
from autodice.dse.links import TOOLS, probe_links
from autodice.dse.profile import fit_link, load_profile

HOSTS = ["edge01", "edge02", "edge03"]
RATE = "200mbit"
RATE_BYTES = 200e6 / 8
CLUSTER_MARKS = (
    pytest.mark.cpp,
    pytest.mark.skipif(os.geteuid() != 0, reason="the emulated cluster needs root (network "
                       "namespaces, veth links, sshd); CI runs these as root"),
    pytest.mark.skipif(not Path("/usr/sbin/sshd").exists() and shutil.which("apt-get") is None,
                       reason="no sshd and no apt-get to install it"),
)


def needs_cluster(test):
    for mark in CLUSTER_MARKS:
        test = mark(test)
    return test


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def emu():
    c = cluster.up(HOSTS, bandwidth=RATE, **TEST_CLUSTER, replace=True)
    yield c
    cluster.down(TEST_CLUSTER["name"])


def _running(exe: str) -> list[int]:
    found = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and os.readlink(p / "exe") == exe:
                found.append(int(p.name))
        except OSError:
            continue
    return found


@needs_cluster
def test_every_pair_is_measured_at_the_shaped_rate(emu, tmp_path):
    links = probe_links(write_inventory(emu, tmp_path, HOSTS))
    assert sorted(links) == ["edge01-edge02", "edge01-edge03", "edge02-edge03"]
    for pair, link in links.items():
        assert link.bandwidth == pytest.approx(RATE_BYTES, rel=0.2), (pair, link)
        assert 0 < link.latency < 2e-3, (pair, link)
    # Built once on edge01 (one architecture, one filesystem); the others got the binary only.
    dirs = {h.name: Path(h.remote_dir) / TOOLS.folder / "build" for h in emu.hosts}
    assert (dirs["edge01"] / "CMakeCache.txt").exists()
    for host in ("edge02", "edge03"):
        assert (dirs[host] / TOOLS.exe).exists() and not (dirs[host] / "CMakeCache.txt").exists()
    assert not [pid for d in dirs.values() for pid in _running(str(d / TOOLS.exe))]


@needs_cluster
def test_cli_profile_writes_the_measured_link(fig2, emu):
    out = fig2 / "profile.json"
    r = invoke("profile", fig2 / "model.onnx", "-p", fig2 / "platform.txt", "-o", out,
               "-i", write_inventory(emu, fig2, ["edge01", "edge02"]),
               "--threads", "1", "--warmup", "1", "--runs", "3")
    assert r.exit_code == 0, r.output
    assert "links measured on the hosts of" in r.output and "edge01-edge02" in r.output
    p = load_profile(out)
    # The Figure 2 platform states no bandwidths: the only host pair is the measured one.
    assert set(p.links) == {"shm", "edge01-edge02"}
    assert p.links["edge01-edge02"].bandwidth == pytest.approx(RATE_BYTES, rel=0.2)
    assert p.links["shm"].bandwidth > 10 * p.links["edge01-edge02"].bandwidth


def test_inventory_hosts_must_be_platform_hosts(fig2):
    """Checked before any network use: no cluster needed."""
    (fig2 / "inventory.toml").write_text('[hosts.edge09]\naddress = "10.79.0.19"\n'
                                         'remote_dir = "/srv/autodice/edge09"\n')
    r = invoke("profile", fig2 / "model.onnx", "-p", fig2 / "platform.txt",
               "-i", fig2 / "inventory.toml")
    assert r.exit_code == 2
    assert (f"error: {fig2 / 'inventory.toml'}: host edge09 is not in {fig2 / 'platform.txt'} "
            "(hosts: edge01, edge02, edge03, edge04, edge05)") in r.output
    assert "1 host(s); measuring links needs at least two" in r.output


@pytest.mark.parametrize("latency, burst", [(1e-4, 0), (1.5e-5, 262144)])
def test_fit_takes_the_sustained_rate_even_past_a_burst(latency, burst):
    """A token bucket lets ``burst`` bytes of a message through at once: the smallest message
    then arrives faster than the rate allows, and only the largest ones show the rate."""
    sizes = [4000, 65536, 401408, 1048576, 4194304]
    times = [latency + max(b - burst, 0) / RATE_BYTES for b in sizes]
    link, _ = fit_link(sizes, times)
    assert link.bandwidth == pytest.approx(RATE_BYTES, rel=1e-6)
    assert link.latency == pytest.approx(latency, rel=1e-6)
