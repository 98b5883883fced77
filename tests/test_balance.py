"""``layers --balance``: the cut whose slowest key is fastest, by measured time per key (not
FLOPs), exact against brute force, and measured for real on ncnn when no profile is given."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from graphs import symbolic_model
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from autodice.cli import main
from autodice.core.model import load_model
from autodice.dse.balance import balance
from autodice.dse.profile import GpuCopies, LayerCost, Link, Profile, save_profile
from autodice.frontend.suggest import balanced_mapping, min_max_cuts


def brute_force(table: list[list[float]], entry: list[list[float]]) -> float:
    n, k = len(table[0]), len(table)
    return min(max(entry[j][c[j]] + sum(table[j][c[j]:c[j + 1]]) for j in range(k))
               for cut in itertools.combinations(range(1, n), k - 1) for c in [(0, *cut, n)])


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.data())
def test_min_max_cuts_is_optimal_for_keys_of_any_speed(data):
    n = data.draw(st.integers(1, 9), label="layers")
    k = data.draw(st.integers(1, min(4, n)), label="keys")
    base = data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0, 7.5, 20.0]), min_size=n,
                              max_size=n))
    speed = data.draw(st.lists(st.sampled_from([0.25, 1.0, 2.0, 3.0]), min_size=k, max_size=k))
    table = [[b * s for b in base] for s in speed]
    # What a key pays to receive what crosses into its run, by where the run starts: none, or
    # any (a dearer entry after a cheaper one is what the right pointer must step back for).
    entry = [[0.0] * (n + 1) for _ in range(k)]
    if data.draw(st.booleans(), label="entry costs"):
        entry = [data.draw(st.lists(st.sampled_from([0.0, 0.5, 4.0, 30.0]), min_size=n + 1,
                                    max_size=n + 1)) for _ in range(k)]
    cuts = min_max_cuts(table, entry)
    assert cuts[0] == 0 and cuts[-1] == n and all(a < b for a, b in zip(cuts, cuts[1:]))
    got = max(entry[j][cuts[j]] + sum(table[j][cuts[j]:cuts[j + 1]]) for j in range(k))
    assert got <= brute_force(table, entry) * (1 + 1e-6) + 1e-12


def chain(n: int = 6) -> onnx.ModelProto:
    """x -> L0 .. L{n-1}: MatMuls by a 64x64 weight, the same FLOPs each."""
    rng = np.random.default_rng(0)
    nodes, weights, prev = [], [], "x"
    for i in range(n):
        weights.append(numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32),
                                               f"w{i}"))
        out = "y" if i == n - 1 else f"t{i}"
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [out], name=f"L{i}"))
        prev = out
    return helper.make_model(helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], weights),
        opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def profile_of(ms: list[float], two_threads: float = 0.5) -> Profile:
    """FIXTURE: layer i takes ms[i] on one core, ``two_threads`` of that on two."""
    layers = tuple(LayerCost(f"L{i}", "MatMul", {1: t, 2: t * two_threads})
                   for i, t in enumerate(ms))
    return Profile("chain.onnx", "fixture", {}, {}, (1, 2), layers, {"shm": Link(5e9, 2e-6)})


def test_time_not_flops_decides_the_cut(tmp_path):
    onnx.save(chain(), tmp_path / "chain.onnx")
    graph = load_model(tmp_path / "chain.onnx")
    keys = ["e1_x860", "e1_x861"]
    assert balanced_mapping(graph, keys)["e1_x860"] == ["L0", "L1", "L2"]  # equal FLOPs
    # Measured, the last layer is as slow as the other five together: it gets a key alone.
    done = balance(graph, tmp_path / "chain.onnx", keys, profile_of([1, 1, 1, 1, 1, 5]))
    assert done.mapping == {"e1_x860": ["L0", "L1", "L2", "L3", "L4"], "e1_x861": ["L5"]}
    # The second key also receives L4's output, 256 bytes over the profile's shm link.
    assert done.seconds == pytest.approx({"e1_x860": 5e-3, "e1_x861": 5e-3 + 2e-6 + 256 / 5e9})
    # A key with two cores (twice as fast here) takes twice the work of a one-core key.
    done = balance(graph, tmp_path / "chain.onnx", ["e1_x8601", "e2_x860"],
                   profile_of([1] * 6))
    assert [len(v) for v in done.mapping.values()] == [4, 2]


def test_receiving_a_cut_tensor_counts_against_its_run(tmp_path):
    """Six equal layers cut 3/3, unless the link makes receiving a tensor cost as much as two
    layers: then the second key takes two layers and the receiving (4 ms each side)."""
    onnx.save(chain(), tmp_path / "chain.onnx")
    graph, keys = load_model(tmp_path / "chain.onnx"), ["e1_x860", "e1_x861"]
    assert [len(v) for v in balance(graph, tmp_path / "chain.onnx", keys,
                                    profile_of([1] * 6)).mapping.values()] == [3, 3]
    slow = replace(profile_of([1] * 6), links={"shm": Link(256 / 2e-3, 0.0)})
    done = balance(graph, tmp_path / "chain.onnx", keys, slow)
    assert [len(v) for v in done.mapping.values()] == [4, 2]
    assert done.seconds == pytest.approx({"e1_x860": 4e-3, "e1_x861": 4e-3})


def with_gpu(profile: Profile, gpu_ms: list[float], latency: float) -> Profile:
    """FIXTURE: ``profile`` with layer i taking gpu_ms[i] on a GPU whose copies each way cost
    ``latency`` plus 1 GB/s."""
    return replace(profile, layers=tuple(replace(lc, gpu_ms=t)
                                         for lc, t in zip(profile.layers, gpu_ms)),
                   gpu=GpuCopies("gpu", Link(1e9, latency), Link(1e9, latency)))


def test_a_gpu_key_pays_its_uploads_and_a_faster_gpu_alone_is_named(tmp_path):
    """On an H100 the GPU ran ResNet-50 alone at 3.66 ms a frame and the --balance cut at 4.3 ms
    (0.77x): when no cut beats one key alone, --balance says which key. A GPU key pays for
    uploading what it receives, by its bytes (balance.py: not the copies' fitted latency)."""
    onnx.save(chain(), tmp_path / "chain.onnx")
    graph, keys = load_model(tmp_path / "chain.onnx"), ["e1_x860", "e1_gpu"]
    # CPU layers 1 ms, GPU layers 0.2 ms: the GPU stage of a 1 / 5 cut is 1 ms of layers and
    # the 256-byte cut, over shm and up to the device at 1 GB/s.
    done = balance(graph, tmp_path / "chain.onnx", keys,
                   with_gpu(profile_of([1] * 6), [0.2] * 6, 1e-3))
    assert [len(v) for v in done.mapping.values()] == [1, 5]
    assert done.seconds["e1_gpu"] == pytest.approx(1e-3 + 256 / 1e9 + 2e-6 + 256 / 5e9)
    # Alone, the GPU would take 1.2 ms: the cut is faster, and no note.
    assert not any("alone is faster" in n for n in done.notes)
    # CPU layers of 3 ms, GPU layers of 0.1 ms: any cut's CPU stage takes 3 ms at least.
    done = balance(graph, tmp_path / "chain.onnx", keys,
                   with_gpu(profile_of([3] * 6), [0.1] * 6, 1e-3))
    assert [len(v) for v in done.mapping.values()] == [1, 5]
    note = next(n for n in done.notes if "alone is faster" in n)
    assert note == ("e1_gpu alone is faster by the profile's layer times: 0.60 ms a frame against "
                    "3.00 ms for this cut's slowest stage; map every layer to e1_gpu for the speed")


def test_cli_balances_by_a_given_profile_and_names_a_foreign_one(tmp_path):
    onnx.save(chain(), tmp_path / "chain.onnx")
    save_profile(profile_of([5, 1, 1, 1, 1, 1]), tmp_path / "p.json")
    r = CliRunner().invoke(main, ["layers", str(tmp_path / "chain.onnx"), "--balance",
                                  "e1_x860,e1_x861", "--profile", str(tmp_path / "p.json")])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"e1_x860": ["L0"], "e1_x861": ["L1", "L2", "L3", "L4", "L5"]}
    save_profile(Profile("other.onnx", "fixture", {}, {}, (1,),
                         (LayerCost("conv9", "Conv", {1: 1.0}),), {"shm": Link(5e9, 2e-6)}),
                 tmp_path / "q.json")
    r = CliRunner().invoke(main, ["layers", str(tmp_path / "chain.onnx"), "--balance",
                                  "e1_x860,e1_x861", "--profile", str(tmp_path / "q.json")])
    assert r.exit_code == 2 and "--balance: profile of other.onnx" in r.output, r.output


@pytest.mark.cpp
@pytest.mark.alone
def test_cli_measures_here_when_no_profile_is_given(zoo_model):
    """SqueezeNet measured on this machine's ncnn: the keys' predicted times are close."""
    r = CliRunner().invoke(main, ["layers", str(zoo_model("squeezenet")), "--balance",
                                  "edge01_x860,edge01_x861,edge01_x862"])
    assert r.exit_code == 0, r.output
    mapping = json.loads(r.stdout)
    assert list(mapping) == ["edge01_x860", "edge01_x861", "edge01_x862"]
    assert all(mapping.values())
    times = [float(t.split()[1]) for t in r.stderr.split(": ", 1)[1].split(", ")]
    assert max(times) < 1.6 * min(times), r.stderr


@pytest.mark.cpp
def test_cli_measures_a_model_of_symbolic_size_at_the_given_input_shape(tmp_path):
    """--input-shape reaches the measuring, as it reaches the listing (it was dropped there)."""
    onnx.save(symbolic_model(), tmp_path / "m.onnx")
    r = CliRunner().invoke(main, ["layers", str(tmp_path / "m.onnx"), "--input-shape",
                                  "x=1x4x32x32", "--balance", "e1_x860,e1_x861"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"e1_x860": ["relu1"], "e1_x861": ["relu2"]}


def test_balance_with_a_platform_counts_the_link_a_cut_crosses(tmp_path):
    """Two boards on a slow link: by compute alone the cut is 3/3 and the note says the link
    is not counted; with -p the second key also pays for receiving its 256-byte input over
    the platform's link (bandwidth=, latency=), as `predict` would."""
    onnx.save(chain(), tmp_path / "chain.onnx")
    graph, keys = load_model(tmp_path / "chain.onnx"), ["e1_x860", "e2_x860"]
    blind = balance(graph, tmp_path / "chain.onnx", keys, profile_of([1] * 6))
    assert [len(v) for v in blind.mapping.values()] == [3, 3]
    assert any("no link known between e1-e2" in n and "compute only" in n for n in blind.notes)
    (tmp_path / "platform.txt").write_text(
        "e1, x86, slots=0, bandwidth=2048kbit, latency=1ms\ne2, x86, slots=0\n")
    save_profile(profile_of([1] * 6), tmp_path / "p.json")
    r = CliRunner().invoke(main, ["layers", str(tmp_path / "chain.onnx"), "--balance",
                                  ",".join(keys), "--profile", str(tmp_path / "p.json"),
                                  "-p", str(tmp_path / "platform.txt")])
    assert r.exit_code == 0, r.output
    # 256 bytes at 256 kB/s and 1 ms: 2 ms, as much as two layers: 4 layers, then 2 + 2 ms.
    assert [len(v) for v in json.loads(r.stdout).values()] == [4, 2]
    assert "e1_x860 4.00 ms, e2_x860 4.00 ms" in r.stderr and "not counted" not in r.stderr
    r = CliRunner().invoke(main, ["layers", str(tmp_path / "chain.onnx"), "--balance",
                                  "e1_x860,e3_x860", "--profile", str(tmp_path / "p.json"),
                                  "-p", str(tmp_path / "platform.txt")])
    assert r.exit_code == 2 and "platform.txt lists no e3" in r.output, r.output
