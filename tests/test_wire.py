"""``gen --wire fp16|int8``: cut tensors that cross hosts travel in fewer bytes.

A chain of seeded convolutions over two hosts, there and back (edge01 -> edge02 -> edge01), run
here under mpirun: the program's tables say which messages are smaller and ``stats.json`` counts
their bytes; a run's outputs are what the same ncnn models chained here compute with the wire's
rounding done in numpy (:func:`autodice.backend.wire.through`), within a millionth of what the wire
moves them, and a session's are a run's, to the bit; ``check --frames`` says what each edge loses;
both of the search's cost paths price the smaller bytes alike. The rounding itself is checked bit
by bit in the runtime's own tests (runtime_cpp/tests), and an aarch64 board sends fp16 to an x86
host in tests/test_arm.py.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from graphs import conv_chain
from onnx import TensorProto, helper, numpy_helper
from test_cost import CHAIN_PLATFORM, CHAIN_PROFILE, chain_model, plan_of

from autodice.backend.agreement import ncnn_chain
from autodice.backend.build import build
from autodice.backend.engine import ensure_ncnn
from autodice.backend.run import check_tolerance, run
from autodice.backend.tools import build_tools
from autodice.backend.wire import Wire, crosses_hosts, through
from autodice.cli import main
from autodice.core.model import load_model
from autodice.core.plan import load_plan
from autodice.core.spec import parse_platform_text
from autodice.dse.cost import plan_cost
from autodice.dse.cost_model import CostModel
from autodice.dse.timing import Timing
from autodice.frontend.check import chain_values, difference
from autodice.frontend.split import split

SIDE, CHANNELS = 40, 32
ELEMENTS = CHANNELS * SIDE * SIDE


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def there_and_back(tmp_path):
    onnx.save(conv_chain(6, channels=CHANNELS, side=SIDE), tmp_path / "model.onnx")
    (tmp_path / "platform.txt").write_text("edge01, cpu, slots=0-1\nedge02, cpu, slots=0-1\n")
    (tmp_path / "mapping.json").write_text(json.dumps(
        {"edge01_cpu0": ["Conv1", "Conv2"], "edge02_cpu0": ["Conv3", "Conv4"],
         "edge01_cpu1": ["Conv5", "Conv6"]}))
    split(tmp_path / "model.onnx", tmp_path / "mapping.json", tmp_path / "platform.txt",
          tmp_path / "out")
    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.standard_normal((1, CHANNELS, SIDE, SIDE)).astype(np.float32))
    np.save(tmp_path / "frames.npy",
            rng.standard_normal((4, CHANNELS, SIDE, SIDE)).astype(np.float32))
    return tmp_path


def test_numpys_rounding_is_the_runtimes():
    x = np.array([1.0, 2049.0, 2051.0, 65519.0, 65520.0, 3e-8, -0.1], np.float32)
    assert through(x, "fp16").tolist() == [1.0, 2048.0, 2052.0, 65504.0, np.inf,
                                           pytest.approx(5.96e-8, rel=1e-3),
                                           pytest.approx(-0.0999755859375)]
    y = np.linspace(-3.0, 11.5, 30, dtype=np.float32)
    step = np.float32(14.5) / np.float32(255)
    assert np.abs(through(y, "int8") - y).max() <= step / 2
    assert through(np.full(4, 7.0, np.float32), "int8").tolist() == [7.0] * 4


def test_only_float_tensors_that_cross_hosts_shrink(there_and_back):
    plan = load_plan(there_and_back / "out")
    assert [(e.src, e.dst) for e in plan.edges] == [(0, (1,)), (1, (2,))]
    assert all(crosses_hosts(plan, e.src, e.dst[0]) for e in plan.edges)
    wire = Wire("fp16")
    assert wire.rank_bytes(plan, 0) == (2 * ELEMENTS, 0)
    assert wire.rank_bytes(plan, 1) == (2 * ELEMENTS, 2 * ELEMENTS)
    assert Wire("int8").rank_bytes(plan, 2) == (0, ELEMENTS + 8)
    assert Wire("fp16", frozenset({plan.edges[0].tag})).rank_bytes(plan, 1) == \
        (2 * ELEMENTS, 4 * ELEMENTS)
    assert Wire().rank_bytes(plan, 1) == (plan.ranks[1].memory.send_bytes,
                                          plan.ranks[1].memory.recv_bytes)
    r = invoke("gen", there_and_back / "out", "--wire", "bf16")
    assert r.exit_code == 2 and "'bf16' is not one of 'fp32', 'fp16', 'int8'" in r.output


@pytest.mark.cpp
@pytest.mark.parametrize("kind", ["fp16", "int8"])
def test_a_run_computes_what_the_wire_rounds_to(there_and_back, kind):
    out = there_and_back / "out"
    plan = load_plan(out)
    r = invoke("gen", out, "--wire", kind)
    assert r.exit_code == 0, r.output
    small = 2 * ELEMENTS if kind == "fp16" else ELEMENTS + 8
    said = [line for line in r.output.splitlines() if line.startswith("edge ")]
    assert said == [f'edge "{e}" ({a} -> {b}): 204.8 KB -> {small / 1000:.1f} KB a frame as {kind}'
                    for e, a, b in [(plan.edges[0].tensor, "edge01 rank 0", "edge02 rank 1"),
                                    (plan.edges[1].tensor, "edge02 rank 1", "edge01 rank 2")]
                    ], r.output
    program = (out / "packages" / "edge01" / "program.cpp").read_text()
    assert program.count(f"Wire::{kind.capitalize()}}}") == 4  # two sends, two receives
    assert Wire.of_output(out) == Wire(kind)
    build(out)
    res = run(out, {"input": there_and_back / "x.npy"}, frames=3)
    assert [r["bytes_sent"] for r in res.stats["ranks"]] == [3 * small, 3 * small, 0]
    plan = load_plan(out)
    feed = {"input": np.load(there_and_back / "x.npy")}
    name = plan.model_outputs[0].name
    exact = chain_values(plan, out, feed)[name]
    # The same ncnn models chained here, the wire's rounding done by numpy: what the run got,
    # where onnxruntime's values (1e-6 apart from ncnn's) would round some values the other way.
    checker = build_tools(ensure_ncnn()) / "ncnn_check"
    wired = ncnn_chain(plan, out / "ncnn", checker, feed, Wire(kind).arrival(plan))[name]
    got = res.outputs[name].reshape(exact.shape)
    lost = difference(got, exact)[1]  # what the wire moved the output by
    assert 1e-4 < lost < check_tolerance(res.stats, Wire(kind))[0], lost
    assert difference(got, wired)[1] < 1e-6 * lost


@pytest.mark.cpp
def test_a_session_streams_through_the_smaller_wire(there_and_back):
    """Frames streamed by a session travel between its ranks as int8 too: each result is what
    a run of the same frame computes (the same program, the same rounding)."""
    import autodice

    out = there_and_back / "out"
    assert invoke("gen", out, "--wire", "int8").exit_code == 0
    build(out)
    frames = np.load(there_and_back / "frames.npy")[:3, None]
    with autodice.open(out) as s:
        streamed = list(s.map(frames))
        rate = s.stats()
    assert rate["frames"] == 3
    for k, frame in enumerate(frames):
        np.save(there_and_back / "one.npy", frame)
        res = run(out, {"input": there_and_back / "one.npy"}, frames=1,
                  results=there_and_back / f"r{k}")
        assert np.array_equal(np.asarray(streamed[k]).reshape(-1),
                              res.outputs[load_plan(out).model_outputs[0].name].reshape(-1))


@pytest.mark.cpp
def test_check_says_what_each_edge_loses(there_and_back):
    out = there_and_back / "out"
    assert invoke("gen", out, "--wire", "int8").exit_code == 0
    r = invoke("check", out, "--frames", there_and_back / "frames.npy")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    edges = [line for line in lines if line.startswith("the wire from rank")]
    assert [line.split(":")[0] for line in edges] == [
        'the wire from rank 0 to 1 (int8)', 'the wire from rank 1 to 2 (int8)'], r.output
    for line in edges:  # at most half a step of 255 over the tensor's range
        assert float(line.split("at most ")[1].split(" ")[0]) <= 1 / 255, line
    assert any(line.startswith("loses the most: the wire from rank") for line in lines), r.output


@pytest.mark.parametrize("kind, comm_ms, span_ms", [("fp32", 9.0, 22.0), ("fp16", 6.5, 19.5),
                                                    ("int8", 5.25, 18.25)])
def test_the_search_prices_the_smaller_bytes(tmp_path, kind, comm_ms, span_ms):
    # test_cost's chain, A and C on d1, B on d2: a (4000 B) goes to d2 and b (1000 B) comes back
    # over a 1 MB/s link with 2 ms of latency each way; the wire sends half or a quarter.
    onnx.save(chain_model(), tmp_path / "chain.onnx")
    platform = parse_platform_text(CHAIN_PLATFORM.format(extra=""))
    timing, graph = Timing(platform, CHAIN_PROFILE), load_model(tmp_path / "chain.onnx")
    mapping = {"d1_arm0": ["A", "C"], "d2_arm0": ["B"]}
    cm = CostModel(graph, timing, kind)
    for c in (cm.cost(cm.slots_of(mapping)),
              plan_cost(plan_of(graph, platform, mapping), timing, graph, wire=kind)):
        assert c.ranks[0].comm_s == pytest.approx(comm_ms / 1e3)
        assert c.ranks[0].span_s == pytest.approx(span_ms / 1e3)


@pytest.mark.cpp
def test_an_edge_past_fp16s_range_stays_fp32(tmp_path):
    # A scales by 1e5 (values past fp16's 65504 / 4 of headroom), B scales back: the first cut
    # keeps fp32, the second travels as fp16.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4, 4])
    up, down = (numpy_helper.from_array(np.array(v, np.float32), n)
                for v, n in ((1e5, "up"), (1e-5, "down")))
    nodes = [helper.make_node("Mul", ["x", "up"], ["a"], name="A"),
             helper.make_node("Mul", ["a", "down"], ["b"], name="B"),
             helper.make_node("Relu", ["b"], ["y"], name="C")]
    model = helper.make_model(helper.make_graph(nodes, "scales", [x], [y], [up, down]),
                              opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.save(model, tmp_path / "model.onnx")
    (tmp_path / "platform.txt").write_text("edge01, cpu, slots=0-1\nedge02, cpu, slots=0-1\n")
    (tmp_path / "mapping.json").write_text(json.dumps(
        {"edge01_cpu0": ["A"], "edge02_cpu0": ["B"], "edge01_cpu1": ["C"]}))
    split(tmp_path / "model.onnx", tmp_path / "mapping.json", tmp_path / "platform.txt",
          tmp_path / "out")
    r = invoke("gen", tmp_path / "out", "--wire", "fp16")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].startswith('edge "a" (edge01 rank 0 -> edge02 rank 1): values up to ') \
        and lines[0].endswith(
        "past fp16's range: it travels as fp32"), r.output
    assert lines[1] == 'edge "b" (edge02 rank 1 -> edge01 rank 2): 512 B -> 256 B a frame as fp16'
    plan = load_plan(tmp_path / "out")
    assert Wire.of_output(tmp_path / "out") == Wire("fp16", frozenset({plan.edges[0].tag}))
    program = (tmp_path / "out" / "packages" / "edge01" / "program.cpp").read_text()
    assert program.count("Wire::Fp16}") == 2
