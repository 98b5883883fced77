"""Boards as they come: an older OS on the board, and the platform file read from the boards.

edge02 runs Debian 11 (bullseye) arm64, glibc 2.31: what JetPack 5 (Ubuntu 20.04) and Raspberry
Pi OS bullseye have. Debian's cross compiler here links glibc 2.36, whose programs such a board
refuses; deploy learns the board's runtime in its check and builds against bullseye's files
(``autodice.deploy.sysroot``), and reads the binary's symbol versions before it ships it
(``autodice.deploy.abi``). edge03 is a Debian 12 board, edge01 an x86 host. The cluster tests need
root, qemu-user-static and the aarch64 cross compiler (``make test`` installs them).
"""

import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import TEST_CLUSTER, board_missing

from autodice.backend.gen import gen
from autodice.core.errors import AutodiceError
from autodice.core.spec import mapping_json
from autodice.deploy import abi
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

