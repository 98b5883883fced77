"""The emulated edge cluster and `autodice deploy` for real: network namespaces, sshd, rsync,
mpirun's ssh launcher across hosts, checked against onnxruntime.

One cluster of four hosts serves the whole module (bringing it up takes a fraction of a second;
the remote builds dominate). Needs root; CI runs as root.
"""

import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from conftest import TEST_CLUSTER, netns
from emulated import write_inventory

import autodice
from autodice.backend.gen import gen
from autodice.backend.session import SessionError
from autodice.cli import main
from autodice.core.errors import AutodiceError
from autodice.core.mapping import mapping_json
from autodice.core.model import load_model
from autodice.deploy.deploy import deploy
from autodice.deploy.emulated import cluster
from autodice.deploy.inventory import load_inventory
from autodice.deploy.ssh import Ssh, close_connections
from autodice.frontend.split import split
from autodice.frontend.suggest import balanced_mapping

pytestmark = [
    pytest.mark.cpp,
    pytest.mark.skipif(os.geteuid() != 0, reason="the emulated cluster needs root (network "
                       "namespaces, veth links, sshd); CI runs these as root"),
]
HOSTS = ["edge01", "edge02", "edge03", "edge04"]
# Figure 2 spread over three hosts: rank 0 on edge01, rank 1 on edge02, rank 2 on edge04.
FIG2_MAPPING = {"edge01_arm123": ["MaxPool1", "Add1"], "edge02_gpu": ["FC1"],
                "edge04_gpu": ["Conv1", "Relu1"]}


@pytest.fixture
def fig2(fig2):
    """Figure 2 with its ARM boards as "cpu" (whatever the host is): the emulated hosts are x86,
    and deploy refuses a host that is not what the platform file says."""
    path = fig2 / "platform.txt"
    path.write_text(path.read_text().replace(", arm,", ", cpu,"))
    return fig2


@pytest.fixture(scope="module")
def emu():
    c = cluster.up(HOSTS, bandwidth="1gbit", **TEST_CLUSTER, replace=True)
    yield c
    cluster.down(TEST_CLUSTER["name"])


@pytest.fixture
def fig2_three_hosts(fig2, emu):
    (fig2 / "mapping.json").write_text(mapping_json(FIG2_MAPPING))
    split(fig2 / "model.onnx", fig2 / "mapping.json", fig2 / "platform.txt", fig2 / "out")
    gen(fig2 / "out", precision="fp32")  # GPU ranks in fp32: outputs held to 1e-5
    x = np.random.default_rng(3).standard_normal((1, 4, 8, 8)).astype(np.float32)
    np.save(fig2 / "x.npy", x)
    write_inventory(emu, fig2, ["edge01", "edge02", "edge04"])
    return fig2


def remote(c, host: str) -> Path:
    return Path(next(h.remote_dir for h in c.hosts if h.name == host))


def test_up_is_idempotent_and_hosts_are_separate(emu):
    _, before = cluster.status(TEST_CLUSTER["name"])
    assert cluster.up(HOSTS, bandwidth="1gbit", **TEST_CLUSTER) == emu
    _, after = cluster.status(TEST_CLUSTER["name"])
    assert [s.sshd_pid for s in after] == [s.sshd_pid for s in before]  # nothing restarted
    assert all(s.netns and s.sshd_pid for s in after)
    # Each host has its own address, name and /etc/hosts, and the rate is on both link ends.
    got = subprocess.run(["ip", "netns", "exec", netns("edge03"), "sh", "-c",
                          "hostname; cat /etc/hosts; ip -4 -o addr show eth0; "
                          "tc qdisc show dev eth0"],
                         capture_output=True, text=True, check=True).stdout
    assert "10.79.0.13/24" in got and "10.79.0.12 edge02" in got and "tbf" in got
    assert "rate 1Gbit" in subprocess.run(["tc", "qdisc", "show", "dev", emu.hosts[2].veth],
                                          capture_output=True, text=True).stdout
    r = CliRunner().invoke(main, ["cluster", "status", "--name", TEST_CLUSTER["name"]])
    assert r.exit_code == 0 and "edge04" in r.output and "10.79.0.14" in r.output


def test_figure2_on_three_hosts(fig2_three_hosts, emu):
    d = fig2_three_hosts
    res = deploy(d / "out", d / "inventory.toml", run=True, inputs={"input": d / "x.npy"},
                 frames=4)
    want = ort.InferenceSession(str(d / "model.onnx")).run(None, {"input": np.load(d / "x.npy")})[0]
    np.testing.assert_allclose(res.run.outputs["output"], want, rtol=1e-5, atol=1e-6)
    assert res.run.stats["frames"] == 4
    # Built once (the hosts share a filesystem and an architecture), copied to the others.
    assert [r.built for r in res.hosts.values()] == [True, False, False]
    assert res.hosts["edge01"].compiled
    assert {r.built_by for r in res.hosts.values()} == {"edge01"}
    # Each host holds only its own sub-models, in its own remote directory.
    assert sorted(p.name for p in (remote(emu, "edge02") / "package" / "models").iterdir()) == [
        "edge02_gpu.ncnn.bin", "edge02_gpu.ncnn.param"]
    assert (d / "out" / "deploy" / "launch" / "rankfile").read_text() == (
        "rank 0=10.79.0.11 slots=1,2,3\nrank 1=10.79.0.12 slots=0\nrank 2=10.79.0.14 slots=0\n")


@pytest.fixture
def fig2_three_kinds(fig2, emu):
    """All three kinds over four hosts: Conv1's rows on edge01 and edge02, Relu1's stage on
    edge04 with a copy on edge03 taking every other frame."""
    (fig2 / "mapping.json").write_text(json.dumps({
        "edge01_arm1": ["MaxPool1", {"layer": "Conv1", "split": "rows"}, "Add1"],
        "edge02_arm1": [{"layer": "Conv1", "split": "rows"}, "FC1"],
        "edge04_x861": ["Relu1"], "edge03_arm1": {"replicates": "edge04_x861"}}))
    split(fig2 / "model.onnx", fig2 / "mapping.json", fig2 / "platform.txt", fig2 / "out")
    gen(fig2 / "out")
    write_inventory(emu, fig2, HOSTS)
    return fig2


def test_a_split_layer_and_a_replicated_stage_across_hosts(fig2_three_kinds):
    fig2 = fig2_three_kinds
    x = np.random.default_rng(4).standard_normal((1, 4, 8, 8)).astype(np.float32)
    np.save(fig2 / "x.npy", x)
    res = deploy(fig2 / "out", fig2 / "inventory.toml", run=True, inputs={"input": fig2 / "x.npy"},
                 frames=5)
    want = ort.InferenceSession(str(fig2 / "model.onnx")).run(None, {"input": x})[0]
    np.testing.assert_allclose(res.run.outputs["output"], want, rtol=1e-5, atol=1e-6)
    assert [r["frames"] for r in res.run.stats["ranks"]] == [5, 5, 3, 2]


def test_mappings_in_turn_each_run_their_own_program(fig2, emu):
    """Two splits over the same hosts with the keys in opposite orders, deployed in turn (as
    `dse --measure` does): the first host builds for both, so each deploy swaps who built the
    binary the hosts hold; each run must still get its own program, not the other's."""
    orders = {"a": {"edge01_arm1": ["Conv1", "MaxPool1", "Relu1"], "edge02_arm1": ["Add1", "FC1"]},
              "b": {"edge02_arm1": ["Conv1", "MaxPool1"], "edge01_arm1": ["Relu1", "Add1", "FC1"]}}
    x = np.random.default_rng(5).standard_normal((1, 4, 8, 8)).astype(np.float32)
    np.save(fig2 / "x.npy", x)
    want = ort.InferenceSession(str(fig2 / "model.onnx")).run(None, {"input": x})[0]
    write_inventory(emu, fig2, ["edge01", "edge02"])
    for name, mapping in orders.items():
        (fig2 / f"{name}.json").write_text(mapping_json(mapping))
        split(fig2 / "model.onnx", fig2 / f"{name}.json", fig2 / "platform.txt", fig2 / name)
        gen(fig2 / name)
    for name in ("a", "b", "a"):
        res = deploy(fig2 / name, fig2 / "inventory.toml", run=True,
                     inputs={"input": fig2 / "x.npy"})
        np.testing.assert_allclose(res.run.outputs["output"], want, rtol=1e-5, atol=1e-6)
        first = next(iter(orders[name])).partition("_")[0]
        assert res.hosts[first].compiled and res.hosts[first].built_by == first


def test_a_redeploy_touches_only_what_changed_on_the_hosts(fig2_three_hosts, emu):
    d = fig2_three_hosts
    deploy(d / "out", d / "inventory.toml")
    again = deploy(d / "out", d / "inventory.toml")
    assert all(r.bytes_sent == 0 and not r.files and not r.compiled
               for r in again.hosts.values()), again.hosts
    # Something changed on the boards since: the next deploy puts the package back.
    program = remote(emu, "edge02") / "package" / "program.cpp"
    program.write_text(program.read_text() + "// edited on the board\n")
    (remote(emu, "edge04") / "package" / "models" / "stray.bin").write_bytes(b"x")
    fixed = deploy(d / "out", d / "inventory.toml", keep_connections_s=0)
    assert fixed.hosts["edge02"].files == ("program.cpp",)
    assert fixed.hosts["edge04"].files == ("deleting models/stray.bin",)
    assert not fixed.hosts["edge01"].files and not fixed.hosts["edge02"].compiled
    assert program.read_text() == (d / "out" / "packages" / "edge02" / "program.cpp").read_text()
    # keep_connections_s=0: no ssh master connection is left open.
    inv = load_inventory(d / "inventory.toml")
    assert not [s for s in Ssh(inv, d).sockets.values() if s.exists()]


def test_a_build_folder_left_half_written_is_built_again(fig2_three_hosts, emu):
    """An interrupted build leaves truncated objects newer than their sources: make trusts them
    and the link fails, so the host builds once more from nothing."""
    d = fig2_three_hosts
    deploy(d / "out", d / "inventory.toml")
    build = remote(emu, "edge01") / "build"  # the hosts' one builder
    objects = list(build.rglob("*.o"))
    assert objects
    for o in objects:
        o.write_bytes(b"")
    (build / "autodice-built").unlink()  # the build script's first step
    again = deploy(d / "out", d / "inventory.toml", run=True, inputs={"input": d / "x.npy"})
    assert again.hosts["edge01"].compiled and again.run is not None


def test_a_host_keeps_the_runtime_library_and_the_next_plan_compiles_alone(fig2_three_hosts,
                                                                            emu):
    """The first build on a host compiles the runtime and keeps it in the host's own cache
    (~/.cache/autodice/runtime); the first deploy of the next plan compiles program.cpp alone,
    links that library and computes what onnxruntime does."""
    d = fig2_three_hosts
    kept = Path(emu.state_dir) / "hosts" / "edge01" / "home" / ".cache" / "autodice" / "runtime"
    shutil.rmtree(kept, ignore_errors=True)
    want = ort.InferenceSession(str(d / "model.onnx")).run(None, {"input": np.load(d / "x.npy")})
    compiled = []
    for _ in range(2):
        for host in ("edge01", "edge02", "edge04"):  # a first deploy of this plan
            shutil.rmtree(remote(emu, host))
            remote(emu, host).mkdir()
        res = deploy(d / "out", d / "inventory.toml", run=True, inputs={"input": d / "x.npy"})
        np.testing.assert_allclose(res.run.outputs["output"], want[0], rtol=1e-5, atol=1e-6)
        log = (remote(emu, "edge01") / "build.log").read_text()
        compiled.append(sorted(Path(ln.rpartition(" ")[2]).name
                               for ln in log.splitlines() if "Building CXX object" in ln))
        assert len(list(kept.glob("*/libautodice_runtime.a"))) == 1
    assert compiled == [["autodice_program.cpp.o", "autodice_runtime.cpp.o",
                         "autodice_stats.cpp.o", "autodice_stream.cpp.o", "autodice_tensors.cpp.o",
                         "program.cpp.o"], ["program.cpp.o"]]


def test_ctrl_c_during_a_remote_build_ends_the_build_on_the_host(fig2_three_hosts, emu):
    """sshd leaves a command without a terminal running when its client goes: an interrupted
    deploy's build went on, and would have built beside the next deploy's in the same folder."""
    d = fig2_three_hosts
    kept = Path(emu.state_dir) / "hosts" / "edge01" / "home" / ".cache" / "autodice" / "runtime"
    shutil.rmtree(kept, ignore_errors=True)  # the runtime compiles too: seconds to interrupt in
    for host in ("edge01", "edge02", "edge04"):
        shutil.rmtree(remote(emu, host))
        remote(emu, host).mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "autodice", "deploy", str(d / "out"), "-i",
                             str(d / "inventory.toml")], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not any(b"cc1plus" in _read(Path(f"/proc/{p}/cmdline"))
                  for p in cluster.netns_pids(netns("edge01"))):
        assert proc.poll() is None and time.monotonic() < deadline, "no compiler ran"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
    proc.wait(60)
    # Every host's masters (earlier tests' too: edge03 is not in this one's inventory).
    close_connections(load_inventory(Path(emu.state_dir) / "inventory.toml").targets.values())
    assert _no_leftovers(wait_s=15) == {}
    again = deploy(d / "out", d / "inventory.toml", run=True, inputs={"input": d / "x.npy"})
    assert again.hosts["edge01"].compiled and again.run is not None


def test_failed_remote_build_shows_its_log_tail(fig2_three_hosts, emu):
    d = fig2_three_hosts
    for host in ("edge01", "edge02", "edge04"):
        with open(d / "out" / "packages" / host / "program.cpp", "a") as f:
            f.write('#error "broken on purpose"\n')
    with pytest.raises(AutodiceError) as e:
        deploy(d / "out", d / "inventory.toml", run=True, inputs={"input": d / "x.npy"})
    log = remote(emu, "edge01").parent / "work" / "build.log"
    first, *tail = str(e.value).splitlines()
    assert first == f"edge01 (root@10.79.0.11:22): build: compiling failed (log: edge01:{log}):"
    assert any('error: #error "broken on purpose"' in line for line in tail)
    assert not (d / "out" / "deploy" / "run.log").exists()  # nothing ran


def test_stopped_sshd_is_named_before_anything_moves(fig2, emu):
    (fig2 / "mapping.json").write_text(mapping_json(
        {"edge01_arm123": ["MaxPool1", "Add1"], "edge02_gpu": ["FC1"],
         "edge03_gpu": ["Conv1", "Relu1"]}))
    split(fig2 / "model.onnx", fig2 / "mapping.json", fig2 / "platform.txt", fig2 / "out")
    gen(fig2 / "out")
    inventory = write_inventory(emu, fig2, ["edge01", "edge02", "edge03"])
    shutil.rmtree(remote(emu, "edge03"), ignore_errors=True)
    cluster.stop_sshd("edge02", TEST_CLUSTER["name"])
    try:
        with pytest.raises(AutodiceError) as e:
            deploy(fig2 / "out", inventory)
        assert e.value.problems == [(
            "edge02 (root@10.79.0.12:22): connect: unreachable (ssh: connect to host 10.79.0.12 "
            "port 22: Connection refused)")]
        assert not remote(emu, "edge03").exists()  # nothing was copied anywhere
        r = CliRunner().invoke(main, ["deploy", str(fig2 / "out"), "-i", str(inventory)])
        assert r.exit_code == 2 and "error: edge02 (root@10.79.0.12:22): connect" in r.output
    finally:
        cluster.up(HOSTS, bandwidth="1gbit", **TEST_CLUSTER)  # repairs: starts the sshd again
    assert all(s.sshd_pid for s in cluster.status(TEST_CLUSTER["name"])[1])


def test_a_platform_written_for_pis_names_the_next_step_on_emulated_hosts(fig2, emu):
    """A platform file for real boards (arm) against the emulated x86 hosts: refused before
    anything moves, saying what to write instead, or how to make the host a board."""
    platform = fig2 / "platform.txt"
    platform.write_text(platform.read_text().replace(", cpu,", ", arm,"))
    (fig2 / "mapping.json").write_text(mapping_json(
        {"edge01_arm123": ["Conv1", "Relu1", "MaxPool1", "Add1"], "edge02_gpu": ["FC1"]}))
    split(fig2 / "model.onnx", fig2 / "mapping.json", platform, fig2 / "out")
    gen(fig2 / "out")
    inventory = write_inventory(emu, fig2, ["edge01", "edge02"])
    shutil.rmtree(remote(emu, "edge01"), ignore_errors=True)
    r = CliRunner().invoke(main, ["deploy", str(fig2 / "out"), "-i", str(inventory)])
    assert r.exit_code == 2, r.output
    assert ("error: edge01 (root@10.79.0.11:22): the platform file says arm but the host is "
            "x86_64 (uname -m): write x86 or cpu (any architecture) for edge01 in the platform "
            "file, or, on an emulated cluster, make it a board: `autodice cluster up --arch "
            "edge01=aarch64 ...`") in r.output
    assert not remote(emu, "edge01").exists()


def test_killed_rank_is_named_and_nothing_survives(fig2_three_hosts, emu):
    d = fig2_three_hosts
    failure = {}

    def job():
        try:
            deploy(d / "out", d / "inventory.toml", run=True, inputs={"input": d / "x.npy"},
                   frames=10_000_000, timeout_s=120)
        except AutodiceError as e:
            failure["error"] = e
        failure["at"] = time.monotonic()

    thread = threading.Thread(target=job)
    thread.start()
    program = str(remote(emu, "edge02") / "build" / "program")
    victim = None
    while victim is None and thread.is_alive():
        victim = next((p for p in cluster.netns_pids(netns("edge02")) if _exe(p) == program), None)
        time.sleep(0.05)
    assert victim is not None, "rank 1 never started on edge02"
    time.sleep(1)
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    thread.join(60)
    assert failure["at"] - killed_at < 10
    assert failure["error"].problems[0] == (
        "edge02 (root@10.79.0.12:22): run: rank 1 (edge02_gpu) died: killed by signal 9 (SIGKILL)")
    # No rank, Open MPI daemon or ssh of the job is left: each namespace holds only its sshd
    # (once the connections deploy keeps open for the next deploy are closed).
    close_connections(load_inventory(Path(emu.state_dir) / "inventory.toml").targets.values())
    assert _no_leftovers() == {}


@pytest.fixture
def jetson_sysfs(tmp_path, monkeypatch):
    """Every emulated host's sensors read from a Jetson's sysfs tree (test_power.py's layout:
    its INA3221 at 5.08 V x 1.2 A on VDD_IN, a CPU-therm zone at 48.5 C): the hosts share this
    machine's filesystem, and AUTODICE_SYSFS names the tree on every board as here."""
    from test_power import jetson, write

    root = jetson(tmp_path / "jetson")
    write(root, {"sys/class/thermal/thermal_zone0/type": "CPU-therm",
                 "sys/class/thermal/thermal_zone0/temp": "48500"})
    monkeypatch.setenv("AUTODICE_SYSFS", str(root / "sys"))
    return root


def test_a_session_streams_distinct_frames_through_all_three_kinds_on_four_hosts(
        fig2_three_kinds, jetson_sysfs):
    """autodice.open on deployed hosts: 300 distinct frames in, each result equal to
    onnxruntime on its own frame, in order; nothing left on any host afterwards. Each board's
    sensors, read over ssh while the session runs, are on /metrics and in the stats."""
    from test_metrics import free_port, scrape

    fig2 = fig2_three_kinds
    inventory = fig2 / "inventory.toml"
    xs = np.random.default_rng(6).standard_normal((300, 1, 4, 8, 8)).astype(np.float32)
    ref = ort.InferenceSession(str(fig2 / "model.onnx"))
    port = free_port()
    with autodice.open(fig2 / "out", inventory=inventory, metrics=f":{port}") as s:
        got = list(s.map(iter(xs)))
        assert np.array_equal(s.infer(xs[9]), got[9])
        deadline, seen = time.monotonic() + 15, {}
        while time.monotonic() < deadline:  # read about every second: wait for two readings
            seen = scrape(f"127.0.0.1:{port}")
            if all(seen.get(f"autodice_host_energy_joules_total{{host={h}}}{{sensor=hwmon:"
                            "ina3221 VDD_IN}", 0) > 0 for h in HOSTS):
                break
            time.sleep(0.3)
        raw = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    for family in ("host_energy_joules_total", "host_power_watts", "host_temperature_celsius"):
        assert raw.decode().count(f"# TYPE autodice_{family} ") == 1, family  # all hosts in one
    for h in HOSTS:
        assert seen[f"autodice_host_temperature_celsius{{host={h}}}{{zone=CPU-therm}}"] == 48.5
        assert seen[f"autodice_host_power_watts{{host={h}}}{{sensor=hwmon:ina3221 VDD_IN}}"] == \
            pytest.approx(5.08 * 1.2)
        energy = s.stats()["energy"][h]
        assert energy["sensor"] == "hwmon:ina3221 VDD_IN" and energy["seconds"] > 0
        assert energy["joules"] == pytest.approx(5.08 * 1.2 * energy["seconds"])
    assert len(got) == 300
    for i, (x, g) in enumerate(zip(xs, got)):
        want = ref.run(None, {"input": x})[0]
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6, err_msg=f"frame {i}")
    st = s.stats()
    assert st["frames_via"] == "socket"  # ssh forwards bytes, not a memfd
    assert st["frames"] == 301 and st["latency_s"]["p50"] > 0
    assert [r["frames"] for r in st["ranks"]] == [301, 301, 151, 150]
    close_connections(load_inventory(inventory).targets.values())
    assert _no_leftovers() == {}


def test_a_host_lost_mid_session_is_named_with_the_last_frame_delivered(fig2_three_hosts, emu):
    d = fig2_three_hosts
    x = np.load(d / "x.npy")
    delivered = []
    program = str(remote(emu, "edge02") / "build" / "program")
    with pytest.raises(SessionError) as lost:
        with autodice.open(d / "out", inventory=d / "inventory.toml") as s:
            for i, _ in enumerate(s.map(itertools.repeat(x))):
                delivered.append(i)
                if i == 50:
                    victim = next(p for p in cluster.netns_pids(netns("edge02"))
                                  if _exe(p) == program)
                    killed_at = time.monotonic()
                    os.kill(victim, signal.SIGKILL)
    assert time.monotonic() - killed_at < 10
    e = lost.value
    assert e.problems[0] == (
        "edge02 (root@10.79.0.12:22): run: rank 1 (edge02_gpu) died: killed by signal 9 (SIGKILL)")
    assert e.delivered == delivered[-1] >= 50
    assert e.problems[-1] == f"the last frame delivered: {e.delivered}"
    close_connections(load_inventory(d / "inventory.toml").targets.values())
    assert _no_leftovers() == {}


def test_ctrl_c_in_a_deployed_session_leaves_nothing_on_the_hosts(fig2_three_hosts, emu):
    d = fig2_three_hosts
    x = np.load(d / "x.npy")
    with pytest.raises(KeyboardInterrupt):
        with autodice.open(d / "out", inventory=d / "inventory.toml") as s:
            for i, _ in enumerate(s.map(itertools.repeat(x))):
                if i == 20:
                    raise KeyboardInterrupt
    close_connections(load_inventory(d / "inventory.toml").targets.values())
    assert _no_leftovers() == {}
    assert not list((remote(emu, "edge01") / "job").glob("stream-*.sock"))  # the forward's


@pytest.mark.parametrize("source", ["repeat", "stream"])
def test_sigkill_of_a_deploy_run_ends_its_job_on_every_host(fig2_three_hosts, emu, source):
    """No code of ours runs on SIGKILL: the launch script on the head sees its ssh go (EOF on
    the stdin we held) and ends mpirun, which ends every rank on every host."""
    d = fig2_three_hosts
    if source == "stream":
        xs = np.lib.format.open_memmap(d / "many.npy", "w+", np.float32, (20_000, 4, 8, 8))
        xs[:] = np.load(d / "x.npy")[0]
        xs.flush()
    args = (["--input", str(d / "x.npy"), "--frames", "100000000"] if source == "repeat"
            else ["--input", str(d / "many.npy")])
    proc = subprocess.Popen([sys.executable, "-m", "autodice", "deploy", str(d / "out"), "-i",
                             str(d / "inventory.toml"), "--run", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len([h for h, ps in _leftovers().items() if any(b"program" in p for p in ps)]) < 3:
        assert time.monotonic() < deadline and proc.poll() is None, "the job did not start"
        time.sleep(0.1)
    time.sleep(1.0)
    proc.kill()
    proc.wait()
    time.sleep(2.0)
    left = {h: [p.split(b"\0")[0] for p in ps] for h, ps in _leftovers().items()}
    # What may stay: the deploy's master connections (sshd's side), kept for the next deploy.
    assert all(p == b"sshd: root@notty" for ps in left.values() for p in ps), left
    close_connections(load_inventory(d / "inventory.toml").targets.values())
    assert _no_leftovers() == {}


def test_deploy_run_streams_a_batch_from_the_cli(fig2_three_hosts, emu):
    d = fig2_three_hosts
    xs = np.random.default_rng(8).standard_normal((30, 4, 8, 8)).astype(np.float32)
    np.save(d / "batch.npy", xs)
    ref = ort.InferenceSession(str(d / "model.onnx"))
    want = np.stack([ref.run(None, {"input": x[None]})[0] for x in xs])
    r = CliRunner().invoke(main, ["deploy", str(d / "out"), "-i", str(d / "inventory.toml"),
                                  "--run", "--input", str(d / "batch.npy"), "--check"])
    assert r.exit_code == 0, r.output
    assert "30 frames" in r.output and "latency p50" in r.output
    np.testing.assert_allclose(np.load(d / "out" / "results" / "output.npy"), want, rtol=1e-5,
                               atol=1e-6)


def test_deploy_run_streams_frames_from_stdin_and_loses_none(fig2_three_hosts, emu):
    """``--input -`` in a real process: the deploy's ssh commands run while the frames wait in
    the pipe, and one that read stdin took them (the stream came up short)."""
    d = fig2_three_hosts
    xs = np.random.default_rng(9).standard_normal((40, 1, 4, 8, 8)).astype(np.float32)
    ref = ort.InferenceSession(str(d / "model.onnx"))
    want = np.stack([ref.run(None, {"input": x})[0] for x in xs])
    r = subprocess.run([sys.executable, "-m", "autodice", "deploy", str(d / "out"), "-i",
                        str(d / "inventory.toml"), "--run", "--input", "-"],
                       input=xs.tobytes(), capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode()
    np.testing.assert_allclose(np.load(d / "out" / "results" / "output.npy"), want,
                               rtol=1e-5, atol=1e-6)


def _no_leftovers(wait_s: float = 5) -> dict:
    """What of a job is still running on the hosts after ``wait_s`` seconds (their sshd aside)."""
    deadline = time.monotonic() + wait_s
    while (left := _leftovers()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _exe(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _leftovers() -> dict:
    _, rows = cluster.status(TEST_CLUSTER["name"])
    left = {}
    for s in rows:
        others = [p for p in cluster.netns_pids(netns(s.name)) if p != s.sshd_pid]
        if others:
            left[s.name] = [Path(f"/proc/{p}/cmdline").read_bytes()[:80] for p in others
                            if Path(f"/proc/{p}").exists()]
    return {k: v for k, v in left.items() if v}


def test_zoo_model_on_four_hosts_then_only_changed_submodels_move(tmp_path, emu, zoo_model):
    path = zoo_model("squeezenet")
    (tmp_path / "platform.txt").write_text("".join(f"{h}, x86, slots=0-1\n" for h in HOSTS))
    keys = ["edge01_cpu0", "edge02_cpu1", "edge03_cpu0", "edge04_cpu1"]
    graph = load_model(path)
    op = {graph.names[i]: node.op_type for i, node in enumerate(graph.nodes)}
    mapping = balanced_mapping(graph, keys)
    (tmp_path / "mapping.json").write_text(mapping_json(mapping))
    split(path, tmp_path / "mapping.json", tmp_path / "platform.txt", tmp_path / "out")
    gen(tmp_path / "out")
    inventory = write_inventory(emu, tmp_path, HOSTS)
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    want = ort.InferenceSession(str(path)).run(None, {"data_0": x})[0]

    first = deploy(tmp_path / "out", inventory, run=True, inputs={"data_0": tmp_path / "x.npy"},
                   frames=3)
    got = first.run.outputs["softmaxout_1"]
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4
    packages = tmp_path / "out" / "packages"
    models = {h: sum(p.stat().st_size for p in (packages / h / "models").iterdir())
              for h in HOSTS}
    assert all(first.hosts[h].literal_bytes >= models[h] for h in HOSTS)

    # Move edge04's first layers, up to its first Conv, to edge03: only those two sub-models
    # change (weights move with the Conv).
    while op[moved := mapping["edge04_cpu1"].pop(0)] != "Conv":
        mapping["edge03_cpu0"].append(moved)
    mapping["edge03_cpu0"].append(moved)
    (tmp_path / "mapping.json").write_text(mapping_json(mapping))
    split(path, tmp_path / "mapping.json", tmp_path / "platform.txt", tmp_path / "out")
    gen(tmp_path / "out")
    again = deploy(tmp_path / "out", inventory, run=True, inputs={"data_0": tmp_path / "x.npy"},
                   frames=3)
    for h in ("edge01", "edge02"):  # same sub-models: only the new program source moves
        assert not [f for f in again.hosts[h].files if "models/" in f], again.hosts[h]
        assert again.hosts[h].bytes_sent < 64_000 < models[h]
    for h, key in (("edge03", "edge03_cpu0"), ("edge04", "edge04_cpu1")):
        assert f"models/{key}.ncnn.bin" in again.hosts[h].files
    got = again.run.outputs["softmaxout_1"]
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4
    report = json.loads((tmp_path / "out" / "deploy" / "report.json").read_text())
    assert report["hosts"]["edge01"]["bytes_sent"] == again.hosts["edge01"].bytes_sent


def test_dse_measures_front_points_on_the_hosts(fig2, emu, jetson_sysfs):
    from test_cost import fixture_profile

    from autodice.dse.profile import save_profile

    (fig2 / "two.txt").write_text("edge01, x86, slots=0, power_idle=5W, bandwidth=1gbit\n"
                                  "edge02, x86, slots=0, power_idle=5W, bandwidth=1gbit\n")
    save_profile(fixture_profile(load_model(fig2 / "model.onnx")), fig2 / "profile.json")
    inventory = write_inventory(emu, fig2, ["edge01", "edge02"])
    r = CliRunner().invoke(main, [str(a) for a in (
        "dse", fig2 / "model.onnx", "-p", fig2 / "two.txt", "--profile", fig2 / "profile.json",
        "-o", fig2 / "front", "--pop", 8, "--gens", 3, "--measure", 1, "--rounds", 2,
        "--frames", 5, "-i", inventory)])
    assert r.exit_code == 0, r.output
    assert "predicted vs measured on the hosts of" in r.output
    (m,) = json.loads((fig2 / "front" / "measure.json").read_text())
    assert m["where"] == str(inventory) and len(m["runs_fps"]) == 2 and m["frames"] == 5
    assert all(f > 0 for f in m["runs_fps"]) and m["measured_peak_rss_bytes"] > 0
    # Each board's sensor, read over ssh while its job ran, beside the model's energy.
    assert "energy per frame, predicted vs measured on the hosts of" in r.output, r.output
    stats = json.loads((fig2 / "front" / "measure" / "p00" / "results" / "stats.json")
                       .read_text())
    assert m["energy"] and set(m["energy"]) <= {"edge01", "edge02"}
    for host, e in m["energy"].items():
        assert e["sensor"] == "hwmon:ina3221 VDD_IN" and e["predicted_j_per_frame"] > 0
        ran = stats["energy"][host]
        assert ran["watts"] == pytest.approx(5.08 * 1.2)
        assert ran["joules_per_frame"] == pytest.approx(5.08 * 1.2 * stats["seconds"] / 5)
    # It ran through deploy: the point's deploy report names the hosts it used.
    report = json.loads((fig2 / "front" / "measure" / "p00" / "deploy" / "report.json").read_text())
    assert set(report["hosts"]) <= {"edge01", "edge02"}


def _fault(emu, host: str, fault: str) -> None:
    """Take ``host`` away as a board is lost: its ranks killed or frozen, or its link down."""
    if fault == "link":
        subprocess.run(["ip", "netns", "exec", netns(host), "ip", "link", "set", "eth0",
                        "down"], check=True)
        return
    program = str(remote(emu, host) / "build" / "program")
    ranks = [p for p in cluster.netns_pids(netns(host)) if _exe(p) == program]
    assert ranks, f"no rank of ours on {host}"
    for p in ranks:
        try:
            os.kill(p, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        except ProcessLookupError:  # ended at the loss of one killed before it
            pass


def _answers(emu, host: str, timeout_s: float = 15) -> None:
    """Wait until ``host``'s sshd takes a connection: a link just set up again said "No route to
    host" for a moment (its neighbour entry failed while it was down), and a board is back only
    once it answers."""
    address = next(h.address for h in emu.hosts if h.name == host)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((address, 22), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.parametrize("fault", ["kill", "stop", "link"])
def test_a_host_lost_mid_stream_is_left_out_and_no_frame_is_lost(fig2_three_hosts, emu, fault):
    """2,000 distinct frames; edge02 lost at a random frame (killed, frozen, or its link down):
    every result arrives, once, in order, equal to onnxruntime on its own frame; the session
    goes on over edge01 and edge04 and then, once edge02 is back, rebalances onto all three;
    nothing is left on any host."""
    d = fig2_three_hosts
    rng = np.random.default_rng({"kill": 1, "stop": 2, "link": 3}[fault])
    xs = rng.standard_normal((2000, 1, 4, 8, 8)).astype(np.float32)
    at = int(rng.integers(100, 1500))
    ref = ort.InferenceSession(str(d / "model.onnx"))
    got = []
    try:
        with autodice.open(d / "out", inventory=d / "inventory.toml", recover=True) as s:
            for i, y in enumerate(s.map(iter(xs))):
                got.append(y)
                if i == at:
                    _fault(emu, "edge02", fault)
            (incident,) = s.stats()["incidents"]
            if fault == "link":
                with pytest.raises(AutodiceError, match="edge02"):
                    s.rebalance()  # still down: an error, and the stream goes on as it was
                assert len(list(s.map(iter(xs[:5])))) == 5
                subprocess.run(["ip", "netns", "exec", netns("edge02"), "ip", "link", "set", "eth0",
                                "up"], check=True)
                _answers(emu, "edge02")
            s.rebalance()
            again = list(s.map(iter(xs[:20])))
            assert s.stats()["incidents"][-1]["rebalanced"] == ["edge02"]
    finally:
        subprocess.run(["ip", "netns", "exec", netns("edge02"), "ip", "link", "set", "eth0", "up"])
    assert len(got) == 2000
    for i, (x, g) in enumerate(zip(xs, got)):
        np.testing.assert_allclose(g, ref.run(None, {"input": x})[0], rtol=1e-5, atol=1e-6,
                                   err_msg=f"frame {i}")
    assert len(again) == 20
    for x, g in zip(xs, again):
        np.testing.assert_allclose(g, ref.run(None, {"input": x})[0], rtol=1e-5, atol=1e-6)
    assert incident["lost"] == ["edge02"]
    assert set(incident["mapping"]) == {"edge01_arm123", "edge04_gpu"}
    assert 0 < incident["replayed"] <= s.window
    assert incident["after_frame"] >= at
    close_connections(load_inventory(Path(emu.state_dir) / "inventory.toml").targets.values())
    assert _no_leftovers() == {}



def test_a_second_host_lost_finds_its_job_prepared_too(fig2, emu):
    """Four hosts, two lost one after the other (their links down): after the first recovery
    the jobs for each next loss are prepared ahead as well (the second used to be a cold split,
    gen and build while the stream waited); every frame arrives, equal to onnxruntime."""
    (fig2 / "mapping.json").write_text(mapping_json({
        "edge01_arm123": ["Conv1", "MaxPool1"], "edge02_arm1": ["Add1"],
        "edge03_arm1": ["Relu1"], "edge04_x860": ["FC1"]}))
    split(fig2 / "model.onnx", fig2 / "mapping.json", fig2 / "platform.txt", fig2 / "out")
    gen(fig2 / "out")
    write_inventory(emu, fig2, HOSTS)
    xs = np.random.default_rng(5).standard_normal((600, 1, 4, 8, 8)).astype(np.float32)
    ref = ort.InferenceSession(str(fig2 / "model.onnx"))
    got = []
    try:
        with autodice.open(fig2 / "out", inventory=fig2 / "inventory.toml", recover=True) as s:
            assert s.recovery.wait_ready()
            for i, y in enumerate(s.map(iter(xs))):
                got.append(y)
                if i in (100, 350):
                    if i == 350:
                        assert s.recovery.wait_ready()  # the next losses' jobs, shipped
                    _fault(emu, "edge02" if i == 100 else "edge03", "link")
            first, second = s.stats()["incidents"]
    finally:
        for host in ("edge02", "edge03"):
            subprocess.run(["ip", "netns", "exec", netns(host), "ip", "link", "set", "eth0",
                            "up"])
    assert (first["lost"], second["lost"]) == (["edge02"], ["edge03"])
    assert first["prepared_ahead"] and second["prepared_ahead"]
    assert {k.split("_")[0] for k in second["mapping"]} <= {"edge01", "edge04"}
    assert len(got) == len(xs)
    for i, (x, g) in enumerate(zip(xs, got)):
        np.testing.assert_allclose(g, ref.run(None, {"input": x})[0], rtol=1e-5, atol=1e-6,
                                   err_msg=f"frame {i}")
    for host in ("edge02", "edge03"):
        _answers(emu, host)


def test_losing_the_head_is_a_clear_error_even_with_recover(fig2_three_hosts, emu):
    d = fig2_three_hosts
    x = np.load(d / "x.npy")
    with pytest.raises(SessionError) as lost:
        with autodice.open(d / "out", inventory=d / "inventory.toml", recover=True) as s:
            for i, _ in enumerate(s.map(itertools.repeat(x))):
                if i == 30:
                    _fault(emu, "edge01", "kill")
    assert "edge01 is lost: it holds the input rank and the session's gateway, and " \
           "recovering from its loss is out of scope" in lost.value.problems
    close_connections(load_inventory(Path(emu.state_dir) / "inventory.toml").targets.values())
    assert _no_leftovers() == {}


def test_deploy_run_recover_from_the_cli_goes_on_without_a_killed_host(fig2_three_hosts, emu):
    """`deploy --run --input batch.npy --recover --check`: edge02's rank killed mid-stream; the
    CLI says what it did, and every frame's result is there and right."""
    d = fig2_three_hosts
    xs = np.random.default_rng(9).standard_normal((20_000, 4, 8, 8)).astype(np.float32)
    np.save(d / "batch.npy", xs)
    program = str(remote(emu, "edge02") / "build" / "program")

    def kill_when_running():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ranks = [p for p in cluster.netns_pids(netns("edge02")) if _exe(p) == program]
            if ranks:
                time.sleep(2.5)  # the session is streaming by then
                _fault(emu, "edge02", "kill")
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_when_running)
    killer.start()
    r = CliRunner().invoke(main, ["deploy", str(d / "out"), "-i", str(d / "inventory.toml"),
                                  "--run", "--input", str(d / "batch.npy"), "--recover",
                                  "--check"])
    killer.join()
    assert r.exit_code == 0, r.output
    said = " ".join(r.output.split())
    assert "20000 frames" in said and "edge02 lost after frame" in said, said
    assert "went on over edge01, edge04" in said and "check output" in said
    got = np.load(d / "out" / "results" / "output.npy")
    ref = ort.InferenceSession(str(d / "model.onnx"))
    for i in range(0, 20_000, 997):
        np.testing.assert_allclose(got[i], ref.run(None, {"input": xs[i][None]})[0],
                                   rtol=1e-5, atol=1e-6, err_msg=f"frame {i}")


def test_without_root_a_clear_message(tmp_path):
    """As an unprivileged user (for real, through setpriv), `cluster up` says it needs root."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                           sys.executable, "-m", "autodice", "cluster", "up", "--hosts", "edge01",
                           "-o", str(tmp_path / "inv.toml")],
                          capture_output=True, text=True, cwd="/", env={**os.environ, "HOME": "/"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: cluster up needs root"), proc.stderr


def test_down_leaves_nothing_behind(emu):
    """Everything of the tests' cluster goes, and nothing of any other cluster: a cluster of
    another name brought up beside it (as a user's would be) is still up, its sshd alive."""
    other = {"name": "autodice-tests-other", "subnet": "10.80.0.0/24"}
    beside = cluster.up(["edge01"], bandwidth=None, **other, replace=True)
    try:
        assert beside.bridge != emu.bridge and beside.hosts[0].netns != emu.hosts[0].netns
        with pytest.raises(AutodiceError, match="is up with other settings"):
            cluster.up(["edge01", "edge02"], bandwidth=None, **other)  # someone's: refused
        prefix = emu.hosts[0].netns[:-len("edge01")]
        removed = cluster.down(TEST_CLUSTER["name"])
        assert f"bridge {emu.bridge}" in removed and f"namespace {prefix}edge01" in removed
        assert not [ln for ln in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                text=True).stdout.splitlines()
                    if ln.startswith(prefix)]
        assert not [n for n in os.listdir("/sys/class/net")
                    if n == emu.bridge or n in {h.veth for h in emu.hosts}]
        etc = Path("/etc/netns")
        assert not etc.is_dir() or not [n for n in os.listdir(etc) if n.startswith(prefix)]
        assert not cluster.state_dir(TEST_CLUSTER["name"]).exists()
        state = str(cluster.state_dir(TEST_CLUSTER["name"])).encode() + b"/"  # not -other's
        assert not [p for p in Path("/proc").iterdir() if p.name.isdigit()
                    and state in _read(p / "cmdline")]  # no sshd (nor anything) of the cluster
        assert cluster.down(TEST_CLUSTER["name"]) == []  # nothing left to remove
        _, rows = cluster.status(other["name"])
        assert [(r.netns, bool(r.sshd_pid)) for r in rows] == [(True, True)]
    finally:
        cluster.down(other["name"])
