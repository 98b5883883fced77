"""An emulated aarch64 board beside an x86 host: cross-built programs, one mpirun across both.

The board (``cluster up --arch edge02=aarch64``) runs every program of its own under qemu-user,
registered in the board's own user namespace; its files are Debian arm64's. Deploy cross-builds
ncnn and the program here and ships the binary; outputs must equal onnxruntime's. Needs root,
``qemu-user-static`` and ``g++-aarch64-linux-gnu`` (``make test`` installs them); CI has them.
"""

import json
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import TEST_CLUSTER, board_missing

from autodice.backend.gen import gen
from autodice.core.errors import AutodiceError
from autodice.core.mapping import mapping_json
from autodice.core.plan import load_plan
from autodice.deploy.deploy import deploy
from autodice.deploy.emulated import cluster
from autodice.deploy.emulated.state import inventory_toml
from autodice.deploy.head_build import HERE
from autodice.frontend.split import split

pytestmark = [pytest.mark.cpp, pytest.mark.skipif(bool(board_missing()), reason=board_missing())]
HOSTS = ["edge01", "edge02"]
ELF_MACHINE = {b"\x3e\x00": "x86_64", b"\xb7\x00": "aarch64"}


@pytest.fixture(scope="module")
def emu():
    c = cluster.up(HOSTS, bandwidth="1gbit", arch={"edge02": "aarch64"}, **TEST_CLUSTER,
                   replace=True)
    yield c
    cluster.down(TEST_CLUSTER["name"])


def ssh(c, host: str, command: str) -> str:
    return subprocess.run(["ssh", "-F", "/dev/null", "-i", str(c.identity), "-o",
                           f"UserKnownHostsFile={c.known_hosts}", "-o", "BatchMode=yes",
                           f"root@{host}", command],
                          capture_output=True, text=True, timeout=60).stdout.strip()


def machine_of(path: Path) -> str:
    """The architecture an ELF executable is for (its e_machine field)."""
    with open(path, "rb") as f:
        head = f.read(20)
    assert head[:4] == b"\x7fELF"
    return ELF_MACHINE.get(head[18:20], repr(head[18:20]))


def test_the_board_is_an_aarch64_board(emu):
    addr = {h.name: h.address for h in emu.hosts}
    assert ssh(emu, addr["edge02"], "uname -m") == "aarch64"
    assert ssh(emu, addr["edge01"], "uname -m") == "x86_64"
    # What a board has and has not: Debian's aarch64 tools, its Open MPI; no compiler.
    said = ssh(emu, addr["edge02"], "command -v c++ cmake; rsync --version | head -n 1; "
                                    "echo; hostname")
    assert "rsync" in said and "c++" not in said and said.endswith("edge02")
    # The handler lives in the board's namespace only: this machine's binfmt_misc has none.
    assert not Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists()


def _job(folder: Path, model: Path, keys: dict[str, list[str]], platform: str, **gen_args
         ) -> Path:
    (folder / "mapping.json").write_text(mapping_json(keys))
    (folder / "platform.txt").write_text(platform)
    split(model, folder / "mapping.json", folder / "platform.txt", folder / "out")
    gen(folder / "out", **gen_args)
    return folder / "out"


def _inventory(c, folder: Path, **extra: str) -> Path:
    text = inventory_toml(c, HOSTS)
    for host, line in extra.items():
        text = text.replace(f"[hosts.{host}]\n", f"[hosts.{host}]\n{line}\n")
    (folder / "inventory.toml").write_text(text)
    return folder / "inventory.toml"


PLATFORM = "edge01, x86, slots=0-1\nedge02, arm, slots=0-1\n"


def _check_run(c, out: Path, inventory: Path, model: Path, x: np.ndarray, name: str) -> dict:
    np.save(out.parent / "x.npy", x)
    res = deploy(out, inventory, run=True, inputs={name: out.parent / "x.npy"}, frames=2)
    session = ort.InferenceSession(str(model))
    want = session.run(None, {name: x})[0]
    got = res.run.outputs[session.get_outputs()[0].name]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    # Cross-built here for the board, built on itself for the x86 host; each holds its kind.
    assert res.hosts["edge02"].built_by == HERE and res.hosts["edge02"].arch == "aarch64"
    assert res.hosts["edge01"].built_by == "edge01"
    work = {h.name: Path(h.remote_dir) for h in c.hosts}
    assert machine_of(work["edge02"] / "build" / "program") == "aarch64"
    assert machine_of(work["edge01"] / "build" / "program") == "x86_64"
    return res.run.stats


@pytest.mark.parametrize("first, wire", [("edge01", "fp32"), ("edge02", "fp16")])
def test_squeezenet_across_an_x86_host_and_an_arm64_board(emu, tmp_path, zoo_model, first,
                                                          wire):
    """SqueezeNet in two halves; the input is read on ``first`` (both placements). From the
    board, the cut travels as fp16: packed by the portable code there, unpacked by F16C here."""
    model = zoo_model("squeezenet")
    nodes = [n.name for n in onnx.load(model, load_external_data=False).graph.node]
    half = len(nodes) * 2 // 3
    second = "edge02" if first == "edge01" else "edge01"
    family = {"edge01": "x86", "edge02": "arm"}
    keys = {f"{first}_{family[first]}0": nodes[:half], f"{second}_{family[second]}0": nodes[half:]}
    out = _job(tmp_path, model, keys, PLATFORM, wire=wire)
    x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    stats = _check_run(emu, out, _inventory(emu, tmp_path), model, x, "data_0")
    arch = {"edge01": "x86_64", "edge02": "aarch64"}
    assert [r["arch"] for r in stats["ranks"]] == [arch[first], arch[second]]
    cut = sum(e.nbytes for e in load_plan(out).edges)
    assert stats["ranks"][0]["bytes_sent"] == 2 * cut * (0.5 if wire == "fp16" else 1)
    # Nothing changed: the redeploy compiles nothing and moves no file.
    again = deploy(out, tmp_path / "inventory.toml")
    assert not any(r.compiled or r.files for r in again.hosts.values())


def test_an_int8_key_on_the_arm64_board(emu, tmp_path, zoo_model):
    """SqueezeNet's second half in int8 on the board (ncnn cross-built with its int8 layers):
    what the board computes is what the same int8 models compute here, and it says int8."""
    from autodice.backend.agreement import ncnn_chain
    from autodice.backend.engine import ensure_ncnn
    from autodice.backend.tools import build_tools

    model = zoo_model("squeezenet")
    nodes = [n.name for n in onnx.load(model, load_external_data=False).graph.node]
    half = len(nodes) * 2 // 3
    rng = np.random.default_rng(3)
    np.save(tmp_path / "calibration.npy", rng.standard_normal((8, 3, 224, 224)).astype("f4"))
    out = _job(tmp_path, model, {"edge01_x860": nodes[:half], "edge02_arm0": nodes[half:]},
               PLATFORM, precision="edge02_arm0=int8", calibration=tmp_path / "calibration.npy")
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    res = deploy(out, _inventory(emu, tmp_path), run=True, inputs={"data_0": tmp_path / "x.npy"},
                 frames=2)
    assert [(r["arch"], r["precision"]) for r in res.run.stats["ranks"]] == \
        [("x86_64", "fp32"), ("aarch64", "int8")]
    plan = load_plan(out)
    here = ncnn_chain(plan, out / "ncnn", build_tools(ensure_ncnn()) / "ncnn_check",
                       {"data_0": x})
    name = plan.model_outputs[0].name
    got, want = res.run.outputs[name], here[name].reshape(res.run.outputs[name].shape)
    # ARM's int8 kernels and x86's round alike up to an accumulation order: close, not equal
    assert np.abs(got - want).max() <= 1e-2 * np.abs(want).max()


def test_a_cut_inside_a_residual_block(emu, tmp_path, zoo_model):
    """ResNet-50 cut between the two convolutions of a bottleneck: the block's main path and its
    shortcut both cross from the x86 host to the board."""
    model = zoo_model("resnet50")
    graph = onnx.load(model, load_external_data=False).graph
    nodes = [n.name or n.output[0] for n in graph.node]
    adds = [i for i, n in enumerate(graph.node) if n.op_type in ("Add", "Sum")]
    cut = adds[-2] - 3  # inside the last but one block: from its last Relu on, on the board
    keys = {"edge01_x860": nodes[:cut], "edge02_arm0": nodes[cut:]}
    out = _job(tmp_path, model, keys, PLATFORM)
    crossing = {e["tensor"] for e in json.loads((out / "plan.json").read_text())["edges"]}
    assert len(crossing) >= 2  # the main path and the shortcut
    x = np.random.default_rng(2).standard_normal((1, 3, 224, 224)).astype(np.float32)
    _check_run(emu, out, _inventory(emu, tmp_path), model, x, graph.input[0].name)


def test_a_host_that_is_not_what_the_platform_says(emu, tmp_path, zoo_model):
    model = zoo_model("squeezenet")
    nodes = [n.name for n in onnx.load(model, load_external_data=False).graph.node]
    out = _job(tmp_path, model, {"edge01_x860": nodes[:30], "edge02_x860": nodes[30:]},
               "edge01, x86, slots=0-1\nedge02, x86, slots=0-1\n")
    with pytest.raises(AutodiceError) as e:
        deploy(out, _inventory(emu, tmp_path))
    assert e.value.problems == [
        "edge02 (root@10.79.0.12:22): the platform file says x86 but the host is aarch64 "
        "(uname -m): write arm or cpu (any architecture) for edge02 in the platform file"]
    assert not (out / "deploy" / "cross").exists()  # stopped before anything was built


def test_a_board_asked_to_build_itself_without_a_compiler(emu, tmp_path, zoo_model):
    model = zoo_model("squeezenet")
    nodes = [n.name for n in onnx.load(model, load_external_data=False).graph.node]
    out = _job(tmp_path, model, {"edge01_x860": nodes[:30], "edge02_arm0": nodes[30:]}, PLATFORM)
    with pytest.raises(AutodiceError) as e:
        deploy(out, _inventory(emu, tmp_path, edge02='build = "board"'))
    (line,) = e.value.problems
    assert line.startswith("edge02 (root@10.79.0.12:22): check: missing c++, cmake, make")
    assert line.endswith("or apt-get install g++-aarch64-linux-gnu here to cross-build for it")


def test_profile_on_the_board_and_a_dse_point_measured_there(emu, tmp_path, fig2):
    """`autodice profile --on edge02` times the layers on the board itself (the profiler
    cross-built for it), on each kind of core of a big.LITTLE board (the platform calls its
    core 1 little): pinned to core 0, then to core 1. dse searches the board with that profile,
    and `--measure` deploys the point it proposes onto the board and runs it there. Under qemu
    the times mean nothing (and the cores are alike); the path must work."""
    from click.testing import CliRunner

    from autodice.cli import main
    from autodice.dse.profile import load_profile

    model, platform = fig2 / "model.onnx", tmp_path / "platform.txt"
    platform.write_text("edge01, x86, slots=0-1\nedge02, arm, slots=0-1, little=1\n")
    inventory = _inventory(emu, tmp_path)
    runner = CliRunner()
    said = runner.invoke(main, ["profile", str(model), "-p", str(platform), "-i", str(inventory),
                                "--on", "edge02", "-o", str(tmp_path / "board.json"),
                                "--runs", "3", "--warmup", "1", "--no-cache"])
    assert said.exit_code == 0, said.output
    board = load_profile(tmp_path / "board.json")
    big = tuple(c for c in range(board.machine["cores"]) if c != 1)  # the board's nproc
    assert board.machine["arch"] == "aarch64" and board.little.big_cores == big
    assert board.little.cores == (1,) and board.little.threads == (1,)
    assert 1 in board.threads and max(board.threads) <= len(big)
    assert all(lc.cpu_ms[1] > 0 and lc.little_ms[1] > 0 for lc in board.layers)
    assert "edge01-edge02" in board.links and board.links["shm"].bandwidth > 0
    assert machine_of(Path(remote_dir(emu, "edge02")) / "tools/build/profile_layers") == "aarch64"

    front = tmp_path / "front"
    said = runner.invoke(main, ["dse", str(model), "-p", str(platform), "--profile",
                                f"edge02={tmp_path / 'board.json'}", "--hosts", "edge02",
                                "-o", str(front), "--pop", "8", "--gens", "3", "--measure", "1",
                                "--frames", "3", "--rounds", "1", "-i", str(inventory)])
    assert said.exit_code == 0, said.output
    (point,) = json.loads((front / "measure.json").read_text())
    assert point["measured_fps"] > 0 and point["where"] == str(inventory)
    stats = json.loads((front / "measure" / point["point"] / "results" /
                        "stats.json").read_text())
    assert {r["arch"] for r in stats["ranks"]} == {"aarch64"}


def remote_dir(c, host: str) -> str:
    return next(h.remote_dir for h in c.hosts if h.name == host)
