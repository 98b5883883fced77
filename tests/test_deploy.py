"""The parts of `autodice deploy` that need no network: the inventory, ssh connections, sync
stamps, launch files, the mpirun command and failure reports (tests/test_cluster.py runs deploy
for real)."""

import os
import random
import shlex
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from autodice.cli import main
from autodice.core.errors import AutodiceError
from autodice.deploy import launch, rank_exits, sync
from autodice.deploy.inventory import load_inventory
from autodice.deploy.launch import honours_cores, launch_files, mpirun_argv
from autodice.deploy.rank_exits import run_failure
from autodice.deploy.remote_build import build_groups
from autodice.deploy.ssh import Host, Ssh, connection_key, control_dir, ssh_config
from autodice.deploy.sync import STAMPS, Digests, folder_digest
from autodice.frontend.split import split

INVENTORY = """
network = "10.77.0.0/24"

[defaults]
user = "root"
identity = "id_key"
known_hosts = "known_hosts"
filesystem = "shared"
mpi_prefix = "/opt/mpi"
ncnn_dir = "/opt/ncnn"

[hosts.edge01]
address = "10.77.0.11"
remote_dir = "/srv/autodice/edge01"

[hosts.edge04]
address = "10.77.0.14"
port = 2222
remote_dir = "/srv/autodice/edge04"
"""


@pytest.fixture
def fig2_plan(fig2):
    plan = split(fig2 / "model.onnx", fig2 / "mapping.json", fig2 / "platform.txt", fig2 / "out")
    for name in ("id_key", "known_hosts"):
        (fig2 / name).write_text("")
    (fig2 / "inventory.toml").write_text(INVENTORY)
    return fig2, plan


def test_a_host_whose_ranks_left_no_marker_is_the_one_that_vanished(fig2_plan):
    """mpirun may end a killed rank's wrapper before it writes its marker: the host Open MPI
    names as the vanished peer counts as lost only while none of its ranks left a marker."""
    _, plan = fig2_plan
    hosts = [r.host for r in plan.ranks]  # edge01, edge01, edge04
    said = "An MPI communication peer process has unexpectedly disconnected.\n" \
           "  Local host: edge04\n  Local PID:  25341\n  Peer host:  edge01\n"
    aborted = rank_exits.RankExit(2.0, hosts.index("edge04"), 134, True)
    assert rank_exits.vanished(plan, said, [aborted]) == {"edge01"}
    killed = rank_exits.RankExit(1.0, 0, 137, False)
    assert rank_exits.vanished(plan, said, [killed, aborted]) == set()
    assert rank_exits.deaths_of([killed, aborted]) == [(1.0, 0, 137), (2.0, 2, 134)]
    assert rank_exits.vanished(plan, "no peer named", [aborted]) == set()


def test_inventory_resolves_defaults_and_local_paths(fig2_plan):
    d, plan = fig2_plan
    inv = load_inventory(d / "inventory.toml", plan.hosts())
    assert list(inv.targets) == ["edge01", "edge04"] and inv.network == "10.77.0.0/24"
    t = inv.targets["edge04"]
    assert (t.user, t.port, t.address, t.remote_dir) == ("root", 2222, "10.77.0.14",
                                                          "/srv/autodice/edge04")
    assert t.identity == str(d / "id_key") and t.mpi_prefix == "/opt/mpi"
    assert inv.targets["edge01"].port == 22


def test_inventory_every_offender_at_once(fig2_plan):
    d, plan = fig2_plan
    (d / "inventory.toml").write_text(INVENTORY.replace('[hosts.edge04]', '[hosts.edge09]')
                                      .replace('remote_dir = "/srv/autodice/edge01"',
                                               'remote_dir = "srv/x; rm -rf /"\nprot = 2'))
    with pytest.raises(AutodiceError) as e:
        load_inventory(d / "inventory.toml", plan.hosts())
    where = str(d / "inventory.toml")
    assert e.value.problems == [
        (f'{where}: host edge01: unknown key "prot" (did you mean "port"?); allowed: address (IP '
        "address or DNS name (required)), remote_dir (absolute directory on the host that deploy "
        "owns (required)), user (ssh login (default: your user name)), port (ssh port (default "
        "22)), identity (private key file (default: ssh's own choice)), known_hosts (known_hosts "
        "file to check host keys against (default: ssh's)), mpi_prefix (Open MPI install prefix "
        "on the host (default: the remote PATH)), ncnn_dir (ncnn install prefix on the host "
        "(default: build ncnn there)), filesystem (label shared by hosts on one filesystem: they "
        "share one build per arch), build (\"head\" (cross-build here and ship) or \"board\" "
        "(build there); default: head for a board of another architecture when its cross "
        "compiler is installed here)"),
        (f'{where}: host edge01: remote_dir "srv/x; rm -rf /" must be an absolute path of '
         'letters, digits and "._+@-" (no "..", spaces or quotes)'),
        (f"{where}: host edge04 of the plan has no [hosts.edge04] entry (address, remote_dir) "
         '(did you mean "edge09"?)'),
    ]


@pytest.mark.parametrize("old, new, message", [
    ('address = "10.77.0.11"', 'address = "-oProxyCommand=x"', "is not a host name or IP address"),
    ('remote_dir = "/srv/autodice/edge01"', 'remote_dir = "/srv/../etc"', 'no ".."'),
    ('remote_dir = "/srv/autodice/edge01"', 'remote_dir = "/srv"', "too close to /"),
    ('identity = "id_key"', 'identity = "missing_key"', "missing_key does not exist"),
    ('user = "root"', 'user = "root -oX"', "must be letters"),
    ('[hosts.edge04]\naddress = "10.77.0.14"', '[hosts.edge04]\naddress = "10.77.0.11"',
     "same address"),
])
def test_inventory_refuses_unsafe_values(fig2_plan, old, new, message):
    d, plan = fig2_plan
    assert old in INVENTORY
    (d / "inventory.toml").write_text(INVENTORY.replace(old, new))
    with pytest.raises(AutodiceError, match=message):
        load_inventory(d / "inventory.toml", plan.hosts())


def test_launch_files_and_mpirun_command(fig2_plan):
    d, plan = fig2_plan
    inv = load_inventory(d / "inventory.toml", plan.hosts())
    files = launch_files(plan, inv)
    # The head has a slot more: a session's gateway (rank 3) shares rank 0's first core.
    assert files["hostfile"] == "10.77.0.11 slots=3\n10.77.0.14 slots=1\n"
    assert files["rankfile"] == ("rank 0=10.77.0.11 slots=1,2,3\nrank 1=10.77.0.11 slots=0\n"
                                 "rank 2=10.77.0.14 slots=0\n")
    assert files["rankfile.stream"] == files["rankfile"] + "rank 3=10.77.0.11 slots=1\n"
    assert "Host 10.77.0.14\n  HostName 10.77.0.14\n  Port 2222\n" in files["ssh_config"]
    assert "StrictHostKeyChecking yes" in files["ssh_config"]
    hosts = {h: Host(t, arch="x86_64", cpus=12, cpus_all=12) for h, t in inv.targets.items()}
    argv = mpirun_argv(plan, inv, hosts, ["--frames", "5"])
    assert argv[argv.index("--prtemca") + 1:][:2] == [
        "plm_ssh_agent", "ssh -F /srv/autodice/edge01/launch/ssh_config"]
    assert ["--mca", "btl_tcp_if_include", "10.77.0.0/24"] == argv[
        argv.index("btl_tcp_if_include") - 1:argv.index("btl_tcp_if_include") + 2]
    # A tensor sent at a frame's end moves while the sender computes the next (bench/costmodel).
    assert argv[argv.index("btl_tcp_progress_thread") + 1] == "1"
    assert "--rankfile" in argv  # cores 0-11 exist on every host: bind as the plan says
    assert argv.count(":") == 2 and argv.count("--wdir") == 3
    assert "/srv/autodice/edge04/build/program" in argv
    argv = mpirun_argv(plan, inv, hosts, ["--stream", "/srv/s.sock"], gateway=True)
    assert argv[argv.index("--rankfile") + 1:][:3] == [
        "/srv/autodice/edge01/launch/rankfile.stream", "--bind-to", "core:overload-allowed"]
    assert argv.count(":") == 3 and "/srv/autodice/edge01/results/exit-3" in argv
    hosts["edge01"].cpus = 2  # cores 1,2,3 do not exist there: run unbound
    argv = mpirun_argv(plan, inv, hosts, ["--frames", "5"])
    assert "--rankfile" not in argv and "--bind-to" in argv and not honours_cores(
        plan, hosts)
    # The command crosses one remote shell: quoting keeps every argument whole.
    assert shlex.split(" ".join(shlex.quote(a) for a in argv)) == argv


def test_one_build_per_shared_filesystem_and_arch(fig2_plan):
    d, plan = fig2_plan
    inv = load_inventory(d / "inventory.toml", plan.hosts())
    hosts = [Host(inv.targets[h], arch="x86_64") for h in ("edge01", "edge04")]
    assert {b: [h.target.host for h in g] for b, g in build_groups(hosts).items()} == {
        "edge01": ["edge01", "edge04"]}
    hosts[1].arch = "aarch64"
    assert list(build_groups(hosts)) == ["edge01", "edge04"]


def test_ssh_config_keeps_host_key_checking_on(fig2_plan):
    d, plan = fig2_plan
    inv = load_inventory(d / "inventory.toml", plan.hosts())
    text = ssh_config(inv.targets.values(), by="host")
    assert "Host edge01\n  HostName 10.77.0.11\n" in text
    assert "StrictHostKeyChecking yes" in text and "BatchMode yes" in text
    assert f"UserKnownHostsFile {d / 'known_hosts'}" in text


def test_master_connections_are_shared_only_by_deploys_that_check_the_host_alike(fig2_plan):
    d, plan = fig2_plan
    inv = load_inventory(d / "inventory.toml", plan.hosts())
    ssh = Ssh(inv, d)
    a, b = inv.targets["edge01"], inv.targets["edge04"]
    assert ssh.sockets[a.host].parent == control_dir()
    assert oct(control_dir().stat().st_mode & 0o777) == "0o700"
    text = ssh.config.read_text()
    assert "Host edge01\n" in text and f"  ControlPath {ssh.sockets['edge01']}\n" in text
    assert "ControlMaster no" in text  # only the check opens one (-o ControlMaster=auto)
    assert len(ssh.sockets[a.host].as_posix()) < 90  # sockets: 108 bytes, ssh adds a suffix
    key = connection_key(a)
    assert key != connection_key(b) and key == connection_key(load_inventory(
        d / "inventory.toml").targets["edge01"])
    # Another known key for the host (or another identity, port, user...): another connection.
    (d / "known_hosts").write_text("10.77.0.11 ssh-ed25519 AAAA\n")
    assert connection_key(a) != key
    # The deploy closes the masters it opened, under the names they got when it began.
    once = Ssh(inv, d, keep_s=0)
    stale = once.sockets[a.host]
    stale.write_text("")  # no master answers there: -O stop fails, and the socket goes
    (d / "known_hosts").write_text("10.77.0.11 ssh-ed25519 BBBB\n")  # ssh learnt a key meanwhile
    once.close([a])
    assert not stale.exists()


STAMP = STAMPS + r"""
r=$1; shift
[ "$1" = write ] && echo "$2 $(fp "$r/package")" > "$r/package.synced"
stamps "$r" package launch
"""


def test_a_sync_stamp_holds_while_the_remote_folder_is_untouched(tmp_path):
    """The check's stamps (run here by sh, as a host runs them): the digest a sync recorded is
    reported until a file of the folder changes, appears or goes."""
    (tmp_path / "package" / "models").mkdir(parents=True)
    (tmp_path / "package" / "program.cpp").write_text("int main() {}\n")
    (tmp_path / "package" / "models" / "a.bin").write_bytes(b"\0" * 100)

    def stamps(*args):
        return subprocess.run(["sh", "-c", STAMP, "sh", str(tmp_path), *args], check=True,
                              capture_output=True, text=True).stdout

    assert stamps() == ""
    assert stamps("write", "d1g3st") == "synced_package=d1g3st\n"
    assert stamps() == "synced_package=d1g3st\n"
    (tmp_path / "package" / "models" / "a.bin").write_bytes(b"\1" * 100)  # same size
    assert stamps() == ""
    assert stamps("write", "d2") == "synced_package=d2\n"
    (tmp_path / "package" / "extra").write_text("")
    assert stamps() == ""
    (tmp_path / "package" / "extra").unlink()
    assert stamps() == "synced_package=d2\n"
    (tmp_path / "package" / "program.cpp").unlink()
    assert stamps() == ""


@pytest.mark.parametrize("status", [0, 23])
def test_the_remote_rsync_end_stamps_only_what_it_can_fingerprint(tmp_path, status):
    """rsync's status is the remote end's, also where find cannot fingerprint (BusyBox)."""
    fakes = tmp_path / "bin"
    fakes.mkdir()
    (fakes / "rsync").write_text(f"#!/bin/sh\nexit {status}\n")
    (fakes / "find").write_text("#!/bin/sh\nexit 1\n")
    for f in fakes.iterdir():
        f.chmod(0o755)

    def remote(find_works: bool) -> int:
        if find_works:
            (fakes / "find").unlink(missing_ok=True)
        line = sync.rsync_path(str(tmp_path / "r"), "package", (), "d1") + " --server ."
        env = {**os.environ, "PATH": f"{fakes}:{os.environ['PATH']}"}
        return subprocess.run(["sh", "-c", line], env=env).returncode  # as the login shell

    assert remote(find_works=False) == status
    assert not (tmp_path / "r" / "package.synced").exists()
    assert remote(find_works=True) == status
    assert (tmp_path / "r" / "package.synced").exists() == (status == 0)


def test_digests_are_remembered_until_a_file_changes(tmp_path, monkeypatch):
    folder = tmp_path / "pkg"
    (folder / "models").mkdir(parents=True)
    (folder / "models" / "a.bin").write_bytes(b"x" * 3000)
    (folder / "program.cpp").write_text("int main() {}\n")
    first = folder_digest(folder)
    cache = Digests(tmp_path / "digests.json")
    assert folder_digest(folder, cache) == first
    assert cache.used == {}  # just written: changed again within the clock's tick, unseen
    monkeypatch.setattr(sync, "RACY_NS", -1)  # as if written long before this deploy
    assert folder_digest(folder, cache) == first
    cache.save()
    again = Digests(tmp_path / "digests.json")
    assert folder_digest(folder, again) == first and len(again.used) == 2
    (folder / "models" / "a.bin").write_bytes(b"y" * 3000)
    assert folder_digest(folder, again) != first
    changed = folder_digest(folder, again)
    assert folder_digest(folder, Digests()) == changed
    os.chmod(folder / "program.cpp", 0o755)  # rsync -p carries the mode: so does the digest
    assert folder_digest(folder, again) != changed
    for damaged in ("[1, 2]", '{"x": [1]}', "{"):
        (tmp_path / "digests.json").write_text(damaged)
        assert folder_digest(folder, Digests(tmp_path / "digests.json")) == folder_digest(folder)


def test_failure_report_names_rank_and_host(fig2_plan):
    d, plan = fig2_plan
    inv = load_inventory(d / "inventory.toml", plan.hosts())
    log = Path("run.log")
    # The rank wrappers' markers win over the peers that lost their connection first.
    noisy = ("prterun has exited due to process rank 0 with PID 12 on node edge01 calling\n"
             '"abort".\n')
    lines = run_failure(plan, inv, noisy, 1, 2.5, log, deaths=[(5.0, 2, 137), (6.0, 0, 143)])
    assert lines[0] == ("edge04 (root@10.77.0.14:2222): run: rank 2 (edge04_gpu) died: killed by "
                        "signal 9 (SIGKILL)")
    noticed = ("prterun noticed that process rank 1 with PID 4987 on node edge01 exited on\n"
               "signal 11 (Segmentation fault).\n")
    assert run_failure(plan, inv, noticed, 139, 1.0, log)[0] == (
        "edge01 (root@10.77.0.11:22): run: rank 1 (edge01_gpu) died: killed by signal 11 "
        "(Segmentation fault)")
    # Rank 1 hangs: the ranks that waited on it say so, and it is named, not them.
    hung = ('[rank 0 board1] timed out after 8.0 s waiting to recv "t1" from rank 1 (float32 '
            "1x8): the peer died or is stuck (raise AUTODICE_TIMEOUT_S if it is just slow)\n"
            '[rank 2 board4] timed out after 8.0 s waiting to recv "t2" from rank 1 (float32 '
            "1x8): the peer died or is stuck (raise AUTODICE_TIMEOUT_S if it is just slow)\n")
    lines = run_failure(plan, inv, hung, 5, 9.5, log)
    assert lines[0] == ('edge01 (root@10.77.0.11:22): run: rank 1 (edge01_gpu) stopped responding '
                        '(rank 0 for "t1", rank 2 for "t2" waited in vain)')
    assert lines[1].startswith('rank 0 (edge01_arm123) on host edge01: timed out after 8.0 s')
    said = "[rank 2 board4] cannot load models/edge04_gpu.ncnn.bin (missing or corrupt)\n"
    assert run_failure(plan, inv, said, 4, 1.0, log)[0] == (
        "run: the job failed (exit 4); rank 2 (edge04_gpu) on host edge04: cannot load "
        "models/edge04_gpu.ncnn.bin (missing or corrupt)")


def test_cli_deploy_checks_the_inventory_before_the_network(fig2_plan):
    d, _ = fig2_plan
    (d / "inventory.toml").write_text(INVENTORY.replace("[hosts.edge04]", "[hosts.edge05]"))
    r = CliRunner().invoke(main, ["deploy", str(d / "out"), "-i", str(d / "inventory.toml")])
    assert r.exit_code == 2
    assert "error: " in r.output and "host edge04 of the plan has no [hosts.edge04]" in r.output
    assert 'did you mean "edge05"?' in r.output


@pytest.mark.parametrize("args, said", [
    (["--arch", "edge02"], "--arch edge02: expected HOST=MACHINE[:RELEASE], e.g. edge02=aarch64"),
    (["--arch", "edge03=aarch64"], '--arch edge03=aarch64: "edge03" is not one of --hosts'),
    (["--arch", "edge02=sparc"], "--arch edge02=sparc: "),
    (["--arch", "edge02=aarch64:buster"], '--arch edge02=aarch64:buster: "buster" is not a Debian '
                                          "release known here (known: bookworm, bullseye)"),
    (["--arch", "edge01=x86_64:bullseye"], "--arch edge01=x86_64:bullseye: a host of this "
                                           "machine's kind runs this machine's OS"),
    (["--cores", "edge01"], "--cores edge01: expected HOST=CPUS, e.g. edge01=0-1"),
])
def test_cli_cluster_up_takes_boards_of_another_architecture(args, said):
    """`cluster up --arch edge02=aarch64`, as docs/boards.md says (the option was missing): its
    values are checked before anything is made (and before root is asked for)."""
    r = CliRunner().invoke(main, ["cluster", "up", "--hosts", "edge01,edge02", *args])
    assert r.exit_code == 2 and r.output.startswith(f"error: {said}"), r.output
    assert len(r.output.strip().splitlines()) == 1


def test_cli_deploy_refuses_a_bad_window_or_front_before_the_network(fig2_plan, tmp_path):
    """Said before anything is deployed: --window 0 used to mean the default, -1 a traceback
    once the job ran; a --front that is no dse output was found out at the first lost host."""
    d, _ = fig2_plan
    np.save(d / "batch.npy", np.zeros((3, 1, 4, 8, 8), np.float32))
    run = ["deploy", str(d / "out"), "-i", str(d / "inventory.toml"), "--run", "--input",
           str(d / "batch.npy")]
    (tmp_path / "front").mkdir()
    (tmp_path / "front" / "pareto.json").write_text('{"points": [{"point": "p0"}]}')
    for extra, said in ((["--window", "0"], "error: --window 0: a whole number, at least 1"),
                        (["--window", "-1"],
                         "error: --window -1: a whole number, at least 1 frame"),
                        (["--recover", "--front", str(tmp_path)], "pareto.json: not a dse output"),
                        (["--recover", "--front", str(tmp_path / "front")],
                         "front/pareto.json: not a dse output (KeyError: 'throughput_fps')")):
        r = CliRunner().invoke(main, [*run, *extra])
        assert r.exit_code == 2 and said in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1, r.output


def _under_wrapper(marker: Path) -> tuple[subprocess.Popen, int]:
    """A rank (sleep) under the real wrapper in its own process group, as prted starts it:
    the wrapper, and the rank's pid once it runs. Once it runs, not once it is forked: dash
    vforks, and a child killed between vfork and exec can die inside malloc on the heap it
    shares with the wrapper, which then aborts before its marker (a test's artifact: a real
    rank is killed long after its exec)."""
    proc = subprocess.Popen(["sh", "-c", rank_exits.WRAPPER, "sh", str(marker), "sleep", "30"],
                            start_new_session=True)
    deadline = time.monotonic() + 10
    while not (rank := [c for c in _children(proc.pid) if _runs(c, "sleep")]):
        assert time.monotonic() < deadline, "the rank never started"
        time.sleep(0.002)
    return proc, rank[0]


def _runs(pid: int, program: str) -> bool:
    """Whether ``pid`` has exec'd ``program`` (False once it has gone)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == program
    except OSError:
        return False


def _markers(host_dir: Path) -> list[rank_exits.RankExit]:
    """The markers in ``host_dir``/results as a recovery reads them (the real reader, real sh)."""
    said = subprocess.run(["sh", "-c", rank_exits.EXITS, "sh", str(host_dir)], check=True,
                          capture_output=True, text=True).stdout
    return rank_exits.parse_exits(said)


def _rank_ended(tmp_path: Path, group: bool) -> tuple[int, bool]:
    """A rank sent TERM as mpirun's abort sends it (``group``) or to the rank alone: the code
    and whether it was the abort, from its marker."""
    (tmp_path / "results").mkdir(exist_ok=True)
    proc, rank = _under_wrapper(tmp_path / "results" / f"exit-{int(group)}")
    if group:
        os.killpg(proc.pid, signal.SIGTERM)
    else:
        os.kill(rank, signal.SIGTERM)
    assert proc.wait(10) == 128 + signal.SIGTERM
    (end,) = [e for e in _markers(tmp_path) if e.rank == int(group)]
    assert time.time() - 10 < end.time <= time.time()
    return end.code, end.aborted


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_a_rank_ended_by_mpiruns_abort_still_leaves_its_marker(tmp_path):
    """mpirun aborts a job with TERM to each rank's process group, at times the moment a rank
    was killed: its wrapper lives on to say so, and says it was the abort (no culprit); a rank
    killed on its own with TERM is a death like any other (real sh)."""
    assert _rank_ended(tmp_path, group=True) == (143, True)
    assert _rank_ended(tmp_path, group=False) == (143, False)


def test_a_killed_rank_leaves_its_marker_though_the_abort_comes_as_the_wrapper_writes_it(
        tmp_path):
    """A killed rank's peers abort the job within milliseconds: mpirun's TERM to the wrapper's
    group can come while it writes the marker. A command it forked there (the time once came
    from `date`) died of it and took the marker's time with it, so a recovery saw no death
    (tests/test_cluster.py's head loss, now and then). 60 kills, each with the TERM a random
    0-2 ms after: every one reads as a death by KILL."""
    rng = random.Random(5)
    (tmp_path / "results").mkdir()
    for k in range(60):
        proc, rank = _under_wrapper(tmp_path / "results" / f"exit-{k}")
        os.kill(rank, signal.SIGKILL)
        time.sleep(rng.uniform(0, 0.002))
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    ends = _markers(tmp_path)
    assert sorted(e.rank for e in ends) == list(range(60))
    assert {e.code for e in ends} == {128 + signal.SIGKILL}


def _launch(tmp_path: Path, script: str, hold: bool = True) -> tuple[int, str, float]:
    """Run the head's launch script here around ``sh -c script`` (standing in for mpirun);
    (exit code, what it printed, seconds)."""
    start = time.monotonic()
    owner, held = os.pipe()  # its stdin, held open as HeadJob holds it: EOF means we went
    try:
        proc = subprocess.run(["sh", "-c", launch._LAUNCH, "sh", str(tmp_path / "mpirun.pid"),
                               str(tmp_path / "mpirun.log"), "2", "sh", "-c", script],
                              stdin=owner if hold else subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=60)
    finally:
        os.close(owner)
        os.close(held)
    return proc.returncode, proc.stdout, time.monotonic() - start


@pytest.mark.alone
def test_the_launch_script_ends_mpirun_once_its_owner_is_gone(tmp_path):
    """EOF on the script's stdin (the autodice process, or the ssh that carries the script, went
    however it went) ends mpirun with SIGTERM, which ends every rank of the job."""
    code, _, seconds = _launch(tmp_path, "exec sleep 600", hold=False)
    assert code == 128 + 15 and seconds < 2


@pytest.mark.alone
def test_the_launch_script_stops_an_mpirun_that_hangs_after_its_job(tmp_path):
    """Open MPI's mpirun now and then deadlocks once every process of its job has ended
    (openpmix/prrte#1839). Its shape: children that end, then a parent that never exits. The
    watchdog stops it two idle seconds later and says so; the ranks' markers decide the rest."""
    code, said, seconds = _launch(tmp_path, "echo ranks ran; sleep 2.5 & wait; exec sleep 600")
    assert code == launch.MPIRUN_HUNG
    assert said.splitlines() == ["ranks ran",
                                 "autodice: mpirun hung after its last process ended; stopped"]
    assert 4 <= seconds < 10


@pytest.mark.alone
def test_the_launch_script_passes_mpiruns_own_exit_through_at_once(tmp_path):
    """An mpirun that ends by itself (with children or none) keeps its exit code and output,
    and the watchdog beside it holds nothing up."""
    code, said, seconds = _launch(tmp_path, "sleep 1.5 & wait; echo done; exit 3")
    assert (code, said) == (3, "done\n")
    assert seconds < 2.5
    code, said, seconds = _launch(tmp_path, "exit 0")
    assert (code, said) == (0, "")
    assert seconds < 0.5
    assert not (tmp_path / "mpirun.pid.hung").exists()


@pytest.mark.parametrize("marker", launch.STARTLESS)
def test_the_launch_script_launches_again_an_mpirun_that_started_nothing(tmp_path, marker):
    """Open MPI's mpirun now and then exits at once, its PMIx listener not started or a host's
    daemon gone at its start, nothing run (launch.STARTLESS): launched again, up to three
    times; any other failure is not."""
    tries = tmp_path / "tries"
    startless = (f"echo x >> {tries}; [ $(wc -l < {tries}) -ge {{n}} ] && echo ran && exit 0; "
                 f"echo 'Said: {marker}'; exit 213")
    assert _launch(tmp_path, startless.format(n=3))[:2] == (0, "ran\n")
    assert tries.read_text().count("x") == 3
    tries.unlink()
    code, said, _ = _launch(tmp_path, startless.format(n=4))  # three tries, then its failure
    assert code == 213 and marker in said and tries.read_text().count("x") == 3
    tries.unlink()
    code, said, _ = _launch(tmp_path, f"echo x >> {tries}; echo other; exit 1")
    assert (code, said) == (1, "other\n") and tries.read_text().count("x") == 1
