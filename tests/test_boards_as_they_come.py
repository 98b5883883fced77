"""Boards as they come: an older OS on the board, and the platform file read from the boards.

edge02 runs Debian 11 (bullseye) arm64, glibc 2.31: what JetPack 5 (Ubuntu 20.04) and Raspberry
Pi OS bullseye have. Debian's cross compiler here links glibc 2.36, whose programs such a board
refuses; deploy learns the board's runtime in its check and builds against bullseye's files
(``autodice.deploy.sysroot``), and reads the binary's symbol versions before it ships it
(``autodice.deploy.abi``). edge03 is a Debian 12 board, edge01 an x86 host: ``autodice
platform`` asks all three what they are (``autodice.deploy.survey``). The cluster tests need
root, qemu-user-static and the aarch64 cross compiler (``make test`` installs them).
"""

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from conftest import TEST_CLUSTER, board_missing

from autodice.backend.gen import gen
from autodice.cli import main
from autodice.core.errors import AutodiceError
from autodice.core.mapping import mapping_json
from autodice.core.spec import Device, parse_platform_text
from autodice.deploy import abi, survey
from autodice.deploy.debian import RELEASES
from autodice.deploy.deploy import deploy
from autodice.deploy.emulated import cluster
from autodice.deploy.emulated.state import inventory_toml
from autodice.deploy.head_build import HERE
from autodice.frontend.split import split

on_the_cluster = pytest.mark.skipif(bool(board_missing()), reason=board_missing())
HOSTS = ["edge01", "edge02", "edge03"]
BOOKWORM = abi.Runtime((2, 36), 30)
BULLSEYE = abi.Runtime((2, 31), 28)


@pytest.fixture(scope="module")
def emu():
    c = cluster.up(HOSTS, bandwidth="1gbit", arch={"edge02": "aarch64:bullseye",
                                                   "edge03": "aarch64"},
                   **TEST_CLUSTER, replace=True)
    yield c
    cluster.down(TEST_CLUSTER["name"])


def ssh(c, host: str, command: str) -> subprocess.CompletedProcess:
    address = next(h.address for h in c.hosts if h.name == host)
    return subprocess.run(["ssh", "-F", "/dev/null", "-i", str(c.identity), "-o",
                           f"UserKnownHostsFile={c.known_hosts}", "-o", "BatchMode=yes",
                           f"root@{address}", command],
                          capture_output=True, text=True, timeout=60)


def test_a_board_is_built_for_with_the_newest_release_it_can_load():
    own = BOOKWORM
    assert abi.release_for(BOOKWORM, own, "edge02") is None  # the compiler's own files
    assert abi.release_for(abi.Runtime((2, 39), 33), own, "edge02") is None
    assert abi.release_for(BULLSEYE, own, "edge02").suite == "bullseye"
    assert abi.release_for(abi.Runtime((2, 35), 30), own, "edge02").suite == "bullseye"
    assert abi.release_for(abi.Runtime(), own, "edge02") is None  # the check could not tell
    # A board whose glibc is new enough but whose libstdc++ is older than bookworm's.
    assert abi.release_for(abi.Runtime((2, 36), 28), own, "edge02").suite == "bullseye"
    assert [r.suite for r in RELEASES] == ["bookworm", "bullseye"]


@pytest.mark.parametrize("runtime, said", [
    (abi.Runtime((2, 27), 25), "edge02: its glibc 2.27 is older than 2.28, which the Open MPI "
                               "wheel (manylinux_2_28) needs: update the board's OS"),
    (abi.Runtime((2, 28), 25), "edge02: its runtime (glibc 2.28, libstdc++ 6.0.25) is older than "
                               "Debian bullseye's (glibc 2.31, libstdc++ 6.0.28), the oldest this "
                               'machine builds for: build on the board (build = "board")'),
])
def test_a_board_older_than_every_release_is_one_line(runtime, said):
    with pytest.raises(AutodiceError) as e:
        abi.release_for(runtime, BOOKWORM, "edge02")
    assert e.value.problems == [said]


def test_the_check_reads_a_runtime_as_getconf_and_libc_say_it():
    assert abi.Runtime.of({"glibc": "glibc 2.36", "libstdcxx": "6.0.30"}) == BOOKWORM
    assert abi.Runtime.of({"glibc": "GNU C Library (Debian GLIBC 2.31-13+deb11u11) stable "
                                    "release version 2.31.", "libstdcxx": "6.0.28"}) == BULLSEYE
    assert abi.Runtime.of({"glibc": ""}) == abi.Runtime()


@on_the_cluster
@pytest.mark.parametrize("host", ["edge01", "edge02"])
def test_the_bullseye_board_is_old_and_refuses_what_the_check_says_it_lacks(emu, tmp_path, host):
    """The board's loader and :func:`abi.lacks` agree: a program cross-built against this
    machine's files needs GLIBC_2.34; the bullseye board refuses it, the x86 host runs its own."""
    facts = dict(line.partition("=")[::2] for line in ssh(emu, host, abi.PROBE).stdout.splitlines())
    runtime = abi.Runtime.of(facts)
    hello = tmp_path / "hello"
    source = tmp_path / "hello.cpp"
    source.write_text('#include <iostream>\nint main() { std::cout << "hello" << std::endl; }\n')
    cxx = "aarch64-linux-gnu-g++" if host == "edge02" else "g++"
    subprocess.run([cxx, "-O1", str(source), "-o", str(hello)], check=True)
    work = Path(next(h.remote_dir for h in emu.hosts if h.name == host))
    shutil.copy(hello, work / "hello")
    ran = ssh(emu, host, f"{work}/hello")
    if host == "edge01":
        assert runtime == BOOKWORM and ran.stdout.strip() == "hello"
        assert abi.lacks(hello, runtime) == ""
        return
    assert runtime == BULLSEYE
    assert ran.returncode != 0 and "version `GLIBC_2.34' not found" in ran.stderr
    assert abi.lacks(hello, runtime) == ("the program needs GLIBC_2.34, and the board has "
                                         "glibc 2.31, libstdc++ 6.0.28")


def _job(folder: Path, model: Path, keys: dict[str, list[str]]) -> Path:
    (folder / "mapping.json").write_text(mapping_json(keys))
    (folder / "platform.txt").write_text("edge01, x86, slots=0-1\nedge02, arm, slots=0-1\n")
    split(model, folder / "mapping.json", folder / "platform.txt", folder / "out")
    gen(folder / "out")
    return folder / "out"


@pytest.mark.cpp
@on_the_cluster
def test_squeezenet_across_an_x86_host_and_a_bullseye_board(emu, tmp_path, zoo_model):
    model = zoo_model("squeezenet")
    nodes = [n.name for n in onnx.load(model, load_external_data=False).graph.node]
    half = len(nodes) * 2 // 3
    out = _job(tmp_path, model, {"edge01_x860": nodes[:half], "edge02_arm0": nodes[half:]})
    (tmp_path / "inventory.toml").write_text(inventory_toml(emu, ["edge01", "edge02"]))
    x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    res = deploy(out, tmp_path / "inventory.toml", run=True,
                 inputs={"data_0": tmp_path / "x.npy"}, frames=2)
    session = ort.InferenceSession(str(model))
    want = session.run(None, {"data_0": x})[0]
    got = res.run.outputs[session.get_outputs()[0].name]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    assert [r["arch"] for r in res.run.stats["ranks"]] == ["x86_64", "aarch64"]
    # Built here against bullseye's files; what the board holds asks for nothing newer.
    assert res.hosts["edge02"].built_by == HERE
    assert (out / "deploy" / "cross" / "aarch64-bullseye").is_dir()
    board = next(h for h in emu.hosts if h.name == "edge02")
    shipped = Path(board.remote_dir) / "build" / "program"
    assert abi.needs(shipped).glibc <= (2, 31) and abi.lacks(shipped, BULLSEYE) == ""
    # Nothing changed: the redeploy compiles nothing and moves no file.
    again = deploy(out, tmp_path / "inventory.toml")
    assert not any(r.compiled or r.files for r in again.hosts.values())


RK3588 = "".join([
    "glibc=glibc 2.35\nlibstdcxx=6.0.30\narch=aarch64\nallowed=0-7\nquota=max 100000\n",
    "mem=16303412\nmem_limit=8589934592\nboot_id=b1\nmodel=Radxa ROCK 5B\n",
    *(f"freq={i} {1800000 if i < 4 else 2256000}\n" for i in range(8)),
    *(f"cpuinfo=processor\t: {i}\ncpuinfo=CPU part\t: {'0xd05' if i < 4 else '0xd0b'}\n"
      for i in range(8))])


def test_a_board_with_two_kinds_of_cores_says_which_are_which():
    """An RK3588 (4 Cortex-A55 + 4 Cortex-A76) in a container limited to 8 GiB, beside an x86
    host whose cgroup allows 1.5 of its 4 cores and which has only lavapipe for Vulkan."""
    x86 = ("arch=x86_64\nallowed=0-3\nquota=150000 100000\nmem=32000000\nboot_id=b2\n"
           "icd=lvp_icd.x86_64.json\ncpuinfo=processor\t: 0\n")
    text = survey.platform_text([survey.read("rk01", RK3588), survey.read("edge01", x86)])
    devices = parse_platform_text(text).devices
    assert devices["rk01"] == Device("rk01", "arm", tuple(range(8)), mem=8 * 2**30,
                                     little=(0, 1, 2, 3))
    assert devices["edge01"] == Device("edge01", "x86", (0,), mem=30.5 * 2**30)  # rounded down
    assert "#   cores 4-7: Cortex-A76, 2.26 GHz max\n#   cores 0-3: Cortex-A55, 1.80 GHz max\n" \
        in text
    assert "give a key cores of one kind" in text
    assert "its cgroup's CPU quota (150000 100000) allows 1 of the 4 cores" in text
    assert "its cgroup's memory limit (8.0 GiB) is below the machine's (15.5 GiB)" in text
    assert "no gpu written" in text and "machine=" not in text


def test_a_key_that_holds_big_and_little_cores_is_named_by_split_and_balance(fig2):
    """``little=`` in the platform file: ``split`` and ``layers --balance`` say which key mixes
    the two kinds (a note on stderr; the mapping asked for it, so nothing is refused)."""
    d = fig2
    platform = d / "platform.txt"
    platform.write_text("edge01, arm, slots=0-7, little=0-3\nedge02, arm, slots=0-3\n")
    keys = "edge01_arm2-5,edge02_arm0-3"
    balanced = CliRunner().invoke(main, ["layers", str(d / "model.onnx"), "--balance", keys,
                                         "--by", "flops"])
    assert balanced.exit_code == 0, balanced.output
    (d / "mapping.json").write_text(balanced.stdout)
    r = CliRunner().invoke(main, ["split", str(d / "model.onnx"), "-m",
                                  str(d / "mapping.json"), "-p", str(platform), "-o",
                                  str(d / "out")])
    assert r.exit_code == 0, r.output
    said = [ln for ln in r.stderr.splitlines() if ln.startswith("note:")]
    assert said == ["note: edge01_arm2-5 holds big cores 4-5 and little cores 2-3 of edge01: "
                    "OpenMP waits on the little ones; a key on one kind runs at its own pace"]
    layers = CliRunner().invoke(main, ["layers", str(d / "model.onnx"), "--balance", keys,
                                       "-p", str(platform)])
    assert said[0] in layers.stderr and "edge02" not in said[0]
    with pytest.raises(AutodiceError, match=r"little=4-5: not in its slots \(0-3\)"):
        parse_platform_text("edge01, arm, slots=0-3, little=2-5\n")


@pytest.mark.parametrize("name", ["NVIDIA Jetson AGX Orin, (64GB) #1", "Jetson=Nano\n"])
def test_a_gpu_name_from_a_host_is_data_in_the_platform_file(name):
    s = survey.read("nx01", f"arch=aarch64\nallowed=0-5\nmodel={name}\n")
    device = parse_platform_text(survey.platform_text([s])).devices["nx01"]
    assert device.gpu_api == "VULKAN" and "Jetson" in device.gpu and "," not in device.gpu


def test_cli_platform_refuses_a_missing_inventory_and_writes_nothing(tmp_path):
    r = CliRunner().invoke(main, ["platform", "-i", str(tmp_path / "nope.toml"), "-o",
                                  str(tmp_path / "platform.txt")])
    assert r.exit_code == 2 and r.output.startswith("error: ") and "nope.toml" in r.output
    assert not (tmp_path / "platform.txt").exists()


@on_the_cluster
def test_the_platform_file_is_read_from_an_x86_host_and_two_boards(emu, tmp_path):
    (tmp_path / "inventory.toml").write_text(inventory_toml(emu))
    r = CliRunner().invoke(main, ["platform", "-i", str(tmp_path / "inventory.toml"), "-o",
                                  str(tmp_path / "platform.txt")])
    assert r.exit_code == 0, r.output
    text = (tmp_path / "platform.txt").read_text()
    devices = parse_platform_text(text).devices
    assert [(d.name, d.arch) for d in devices.values()] == [
        ("edge01", "x86"), ("edge02", "arm"), ("edge03", "arm")]
    cores = tuple(sorted(os.sched_getaffinity(0)))
    mem_kb = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
    for d in devices.values():
        # One machine under them all (one kernel): its cores and memory, and it says so.
        assert d.slots == cores and d.machine == "edge01"
        assert mem_kb * 1024 - 0.1 * 2**30 < d.mem <= mem_kb * 1024
    assert "# edge01: uname -m x86_64; glibc 2.36, libstdc++ 6.0.30" in text
    assert "# edge02: uname -m aarch64; glibc 2.31, libstdc++ 6.0.28" in text
    assert "# edge03: uname -m aarch64; glibc 2.36, libstdc++ 6.0.30" in text
    # Each written line on stdout, as written.
    assert [line for line in r.stdout.splitlines() if line.startswith("edge")] == [
        line for line in text.splitlines() if line and not line.startswith("#")]
