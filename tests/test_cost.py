"""The cost model: hand-computed cases, the thread fit, and the fast path equal to the plan's.

Profiles here are FIXTURES written by hand (or derived from FLOPs), not measurements: they pin
down what the model computes from a profile, whatever the profiler later measures.
"""

from dataclasses import replace

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from autodice.core.errors import AutodiceError
from autodice.core.mapping import mapping_json, parse_mapping_text
from autodice.core.model import load_model
from autodice.core.spec import parse_platform_text
from autodice.dse.cost import plan_cost, predict
from autodice.dse.cost_model import CostModel
from autodice.dse.profile import Corun, LayerCost, Link, Profile, save_profile
from autodice.dse.timing import AmdahlFit, DevicePower, Timing, fit_amdahl
from autodice.frontend.layers import layer_table
from autodice.frontend.split import plan_mapping, split


def fixture_profile(graph, gflops: float = 10.0, gpu_speedup: float = 5.0) -> Profile:
    """FIXTURE, not a measurement: each layer costs 2 us + FLOPs at ``gflops`` on one core, 55 %
    of its time beyond the 2 us on two, and 1/``gpu_speedup`` of it plus 10 us on the GPU; it
    loads its ONNX weights, keeps three times them if a Conv (Winograd), and needs a workspace
    of one byte per 100 FLOPs."""
    layers = []
    for row in layer_table(graph):
        if row["follows"]:
            continue
        t1 = 0.002 + row["flops"] / (gflops * 1e6)
        onnx_bytes = graph.weight_bytes(graph.index[row["name"]])
        layers.append(LayerCost(row["name"], row["op"], {1: t1, 2: 0.002 + (t1 - 0.002) * 0.55},
                                t1 / gpu_speedup + 0.01, onnx_bytes,
                                onnx_bytes * (3 if row["op"] == "Conv" else 1),
                                row["flops"] // 100))
    return Profile(str(graph.path), "fixture", {"fixture": True}, {}, (1, 2), tuple(layers),
                   {"shm": Link(5e9, 2e-6)}, Corun(2, 1.2), 30_000_000)


def chain_model() -> onnx.ModelProto:
    """Three layers, one weight::

        x (1x1000) -> A: Relu -> a (4000 B) -> B: MatMul w (1000x250, 1 MB) -> b (1000 B)
                   -> C: Relu -> y (1000 B)
    """
    w = numpy_helper.from_array(np.ones((1000, 250), np.float32), "w")
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="A"),
             helper.make_node("MatMul", ["a", "w"], ["b"], name="B"),
             helper.make_node("Relu", ["b"], ["y"], name="C")]
    graph = helper.make_graph(nodes, "chain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1000])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 250])],
                              [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


CHAIN_PLATFORM = (
    "d1, arm, slots=0-1, power_idle=2W, power_cpu=1W, bandwidth=1MB/s, latency=0.5ms\n"
    "d2, arm, slots=0-3, gpu=Volta (CUDA), power_idle=3W, power_cpu=0.5W, power_gpu=4W, "
    "bandwidth=2MB/s, latency=1.5ms{extra}\n")

# Milliseconds, by hand. Relu: A halves on 2 threads, C does not speed up; MatMul 10 -> 6 ms.
CHAIN_PROFILE = Profile(
    "chain.onnx", "fixture", {}, {}, (1, 2),
    (LayerCost("A", "Relu", {1: 2.0, 2: 1.0}, 0.5),
     LayerCost("B", "MatMul", {1: 10.0, 2: 6.0}, 1.0),
     LayerCost("C", "Relu", {1: 1.0, 2: 1.0}, 0.5)),
    {"shm": Link(1e9, 1e-5)})


@pytest.fixture
def chain(tmp_path):
    onnx.save(chain_model(), tmp_path / "chain.onnx")
    return tmp_path / "chain.onnx"


def chain_cost(model_path, mapping: dict, extra: str = ""):
    """(fast-path cost, plan cost) of ``mapping`` of the chain model."""
    platform = parse_platform_text(CHAIN_PLATFORM.format(extra=extra))
    timing = Timing(platform, CHAIN_PROFILE)
    graph = load_model(model_path)
    cm = CostModel(graph, timing)
    plan = plan_of(graph, platform, mapping)
    return cm.cost(cm.slots_of(mapping)), plan_cost(plan, timing, graph)


def plan_of(graph, platform, mapping: dict):
    """The plan ``split`` makes of ``mapping`` (its passes, nothing written)."""
    return plan_mapping(graph, parse_mapping_text(mapping_json(mapping)), platform)


def test_chain_on_two_devices_by_hand(chain):
    fast, slow = chain_cost(chain, {"d1_arm01": ["A", "B"], "d2_arm0": ["C"]})
    for c in (fast, slow):
        r0, r1 = c.ranks
        assert r0.compute_s == pytest.approx(0.001 + 0.006)  # A, B on 2 threads
        assert r1.compute_s == pytest.approx(0.001)  # C on 1 thread
        # b: 1000 B over the slower link (1 MB/s) + both latencies (0.5 + 1.5 ms) = 3 ms, both ends
        assert r0.comm_s == pytest.approx(0.003) and r1.comm_s == pytest.approx(0.003)
        assert c.period_s == pytest.approx(0.010) and c.throughput == pytest.approx(100.0)
        assert "d1_arm01" in c.bottleneck
        # rank 0: w 1 MB + peak {x, a} 8000 B + send b 1000 B; rank 1: peak {b, y} + recv b
        assert (r0.memory, r1.memory) == (1_000_000 + 8000 + 1000, 2000 + 1000)
        d1, d2 = c.devices
        # idle x period + per-core power x threads x compute + per-core power x comm
        assert d1.energy_j == pytest.approx(2 * 0.010 + 1 * 2 * 0.007 + 1 * 0.003)
        assert d2.energy_j == pytest.approx(3 * 0.010 + 0.5 * 0.001 + 0.5 * 0.003)
        assert c.max_energy_j == pytest.approx(0.037) and c.max_memory == 1_009_000
        assert (c.cores, c.gpus) == (3, 0)


def test_round_trip_makes_a_rank_wait(chain):
    # d1 runs A, sends a (4000 B: 4 ms + 2 ms) to d2 for B, gets b back (1000 B: 1 + 2 ms) for
    # C: one frame keeps d1 busy from A's start to C's end, 2 + 6 + 10 + 3 + 1 = 22 ms, although
    # it computes for 3 ms and transfers for 9.
    fast, slow = chain_cost(chain, {"d1_arm0": ["A", "C"], "d2_arm0": ["B"]})
    for c in (fast, slow):
        r0, r1 = c.ranks
        assert (r0.compute_s, r0.comm_s) == pytest.approx((0.003, 0.009))
        assert r0.span_s == pytest.approx(0.022) and r1.span_s == pytest.approx(0.010)
        assert c.period_s == pytest.approx(0.022) and "round trip" in c.bottleneck


def test_gpu_rank_counts_its_weights_twice(chain):
    fast, slow = chain_cost(chain, {"d1_arm0": ["A"], "d2_gpu": ["B", "C"]})
    for c in (fast, slow):
        r0, r1 = c.ranks
        assert (r0.compute_s, r1.compute_s) == pytest.approx((0.002, 0.0015))
        assert r0.comm_s == pytest.approx(4000 / 1e6 + 0.002)  # a: 4000 B
        assert c.throughput == pytest.approx(1 / 0.008)
        assert r1.memory == 2 * 1_000_000 + 5000 + 4000  # weights twice, peak {a, b}, recv a
        assert c.devices[1].energy_j == pytest.approx(3 * 0.008 + 4 * 0.0015 + 0.5 * 0.006)
        assert (c.cores, c.gpus) == (1, 1)


def test_dedicated_gpu_memory_is_a_separate_capacity(chain):
    fast, slow = chain_cost(chain, {"d1_arm0": ["A"], "d2_gpu": ["B", "C"]},
                            ", gpu_mem=1MB, mem=1GB")
    for c in (fast, slow):
        d2 = c.devices[1]
        assert (d2.ram, d2.gpu_mem) == (1_000_000 + 4000, 1_000_000 + 5000)
        assert d2.memory == 2_009_000
        assert c.over_capacity == ("d2: 1.0 MB on the GPU > gpu_mem 1.0 MB",)


def test_same_host_ranks_use_shared_memory(chain):
    fast, slow = chain_cost(chain, {"d2_arm0": ["A"], "d2_arm123": ["B", "C"]})
    for c in (fast, slow):
        assert c.ranks[0].comm_s == pytest.approx(4000 / 1e9 + 1e-5)
        assert len(c.devices) == 1


def test_busy_neighbours_stretch_a_rank_by_the_corun_slowdown(chain):
    # The profile says one core runs 1.2x slower while both of a 2-core machine's cores work.
    # d1 runs A (2 ms) on core 0 and B, C (11 ms) on core 1; a (4000 B) crosses shared memory
    # in 14 us at both ends. Uncontended, the period is 11.014 ms: rank 1 keeps its core busy
    # 11/11.014 of the time and rank 0 2/11.014, so each stretches by 0.2 x the other's share.
    profile = replace(CHAIN_PROFILE, corun=Corun(2, 1.2))
    platform = parse_platform_text(CHAIN_PLATFORM.format(extra=""))
    graph = load_model(chain)
    timing = Timing(platform, profile)
    cm = CostModel(graph, timing)
    mapping = {"d1_arm0": ["A"], "d1_arm1": ["B", "C"]}
    period0 = 0.011 + 4000 / 1e9 + 1e-5
    for c in (cm.cost(cm.slots_of(mapping)),
              plan_cost(plan_of(graph, platform, mapping), timing, graph)):
        r0, r1 = c.ranks
        assert r0.compute_s == pytest.approx(0.002 * (1 + 0.2 * 0.011 / period0))
        assert r1.compute_s == pytest.approx(0.011 * (1 + 0.2 * 0.002 / period0))
        assert c.period_s == pytest.approx(r1.compute_s + r1.comm_s)
    # One rank on both cores was profiled with both busy: nothing else stretches it.
    whole = {"d1_arm01": ["A", "B", "C"]}
    assert cm.cost(cm.slots_of(whole)).ranks[0].compute_s == pytest.approx(0.001 + 0.006 + 0.001)


@pytest.mark.parametrize("machine", [", machine=vm1", ""])
def test_hosts_on_one_machine_contend_as_one_board(chain, machine):
    # e1 and e2 are one core each; named on one machine (emulated hosts, say), each one's rank
    # keeps the other's core busy as two ranks of one board do. a (4000 B) crosses a 1 MB/s
    # link in 4 ms + 2 x 0.5 ms at both ends: uncontended, rank 1's stage is 11 + 5 = 16 ms.
    lines = "".join(f"{h}, arm, slots=0, bandwidth=1MB/s, latency=0.5ms{machine}\n"
                    for h in ("e1", "e2"))
    platform = parse_platform_text(lines)
    graph = load_model(chain)
    timing = Timing(platform, replace(CHAIN_PROFILE, corun=Corun(2, 1.2)))
    cm = CostModel(graph, timing)
    mapping = {"e1_arm0": ["A"], "e2_arm0": ["B", "C"]}
    shared = 0.2 if machine else 0.0
    for c in (cm.cost(cm.slots_of(mapping)),
              plan_cost(plan_of(graph, platform, mapping), timing, graph)):
        r0, r1 = c.ranks
        assert r0.compute_s == pytest.approx(0.002 * (1 + shared * 0.011 / 0.016))
        assert r1.compute_s == pytest.approx(0.011 * (1 + shared * 0.002 / 0.016))


def test_every_rank_process_pays_the_runtime_bytes(chain):
    profile = replace(CHAIN_PROFILE, runtime_bytes=30_000_000)
    platform = parse_platform_text(CHAIN_PLATFORM.format(extra=""))
    graph = load_model(chain)
    timing = Timing(platform, profile)
    cm = CostModel(graph, timing)
    mapping = {"d2_arm0": ["A"], "d2_arm123": ["B", "C"]}
    for c in (cm.cost(cm.slots_of(mapping)),
              plan_cost(plan_of(graph, platform, mapping), timing, graph)):
        r0, r1 = c.ranks
        # as test_same_host_ranks_use_shared_memory's plan, plus 30 MB per process
        assert (r0.memory, r1.memory) == (30_000_000 + 8000 + 4000, 30_000_000 + 1_000_000
                                          + 5000 + 4000)
        assert c.devices[0].memory == r0.memory + r1.memory


@pytest.mark.parametrize("b_bytes, rank0", [
    # B loads 1 MB and keeps 3 MB (repacked): loading peaks at both copies of w, 4 MB, above
    # the 3 MB kept + activations {x, a} 8000 B + B's 50 kB workspace
    ((1_000_000, 3_000_000, 50_000), 4_000_000),
    # B keeps 1 MB but needs 3 MB of workspace while it runs: running peaks
    ((500_000, 1_000_000, 3_000_000), 1_000_000 + 8000 + 3_000_000)])
def test_cpu_rank_memory_is_what_ncnn_holds(chain, b_bytes, rank0):
    layers = list(CHAIN_PROFILE.layers)
    layers[1] = replace(layers[1], loaded_bytes=b_bytes[0], resident_bytes=b_bytes[1],
                        workspace_bytes=b_bytes[2])
    for k in (0, 2):  # the Relus: no weights, 1 kB of workspace
        layers[k] = replace(layers[k], loaded_bytes=0, resident_bytes=0, workspace_bytes=1000)
    profile = replace(CHAIN_PROFILE, layers=tuple(layers), runtime_bytes=20_000_000)
    platform = parse_platform_text(CHAIN_PLATFORM.format(extra=""))
    graph = load_model(chain)
    timing = Timing(platform, profile)
    cm = CostModel(graph, timing)
    mapping = {"d1_arm01": ["A", "B"], "d2_arm0": ["C"]}
    for c in (cm.cost(cm.slots_of(mapping)),
              plan_cost(plan_of(graph, platform, mapping), timing, graph)):
        r0, r1 = c.ranks
        # + send b 1000 B; rank 1: runtime + peak {b, y} + C's workspace + recv b
        assert r0.memory == 20_000_000 + rank0 + 1000
        assert r1.memory == 20_000_000 + 2000 + 1000 + 1000


def test_unmeasured_thread_count_is_extrapolated(chain):
    # 4 threads were not measured. MatMul's fit from its one sample (10 -> 6 ms on 2 threads) is
    # serial 0, fraction 0.8: B on 4 threads = 6 x (10 - 0.8 x 10 x 3/4) / (10 - 0.8 x 10 / 2)
    # = 4 ms. Relu's fit over A (2 -> 1) and C (1 -> 1): serial 0, fraction 0.8 (least squares
    # of the relative gains 1 and 0 against 1 and 0.5), so C = 1 x (1 - 0.6) / (1 - 0.4) ms.
    fast, slow = chain_cost(chain, {"d1_arm0": ["A"], "d2_arm0123": ["B", "C"]})
    for c in (fast, slow):
        assert c.ranks[1].compute_s * 1e3 == pytest.approx(4.0 + 0.4 / 0.6)


def test_amdahl_fit_sees_that_small_layers_do_not_speed_up():
    t1 = np.array([0.01, 0.03, 0.2, 1.0, 5.0])
    truth = AmdahlFit(0.03, 0.9)
    n = np.array([2] * 5 + [4] * 5)
    fit = fit_amdahl(np.tile(t1, 2), truth.time(np.tile(t1, 2), n), n)
    assert fit.serial_s == pytest.approx(0.03) and fit.fraction == pytest.approx(0.9)
    assert fit.time(0.02, 6) == pytest.approx(0.02)  # below the serial time: no speed-up
    assert fit.time(5.0, 6) == pytest.approx(5.0 - 0.9 * 4.97 * 5 / 6)
    assert fit_amdahl([1.0], [1.2], [2]) == AmdahlFit(0.0, 0.0)  # slower on 2: never negative


def test_timing_extrapolates_per_op_type():
    platform = parse_platform_text("h, x86, slots=0-5, bandwidth=1gbit\n")
    layers = tuple(LayerCost(f"c{k}", "Conv", {1: t, 2: t * 0.55}) for k, t in
                   enumerate((1.0, 2.0, 4.0))) + (LayerCost("r", "Relu", {1: 0.01, 2: 0.01}),)
    timing = Timing(platform, Profile("m", "x", {}, {}, (1, 2), layers, {"shm": Link(1e9, 0)}))
    six = timing.seconds("h", ["c0", "c2", "r"], 6) * 1e3
    assert six[0] == pytest.approx(1.0 * (1 - 0.9 * 5 / 6)) and six[1] == pytest.approx(4 * six[0])
    assert six[2] == pytest.approx(0.01)  # the Relu never sped up: it does not on 6 either
    assert list(timing.seconds("h", ["c1"], 2)) == [pytest.approx(2.0 * 0.55e-3)]  # measured


def test_measured_power_replaces_the_platform_fields(chain):
    platform = parse_platform_text(CHAIN_PLATFORM.format(extra=""))
    timing = Timing(platform, CHAIN_PROFILE, power={"d1": DevicePower(idle=10.0, cpu=0.0)})
    cm = CostModel(load_model(chain), timing)
    c = cm.cost(cm.slots_of({"d1_arm01": ["A", "B", "C"]}))
    assert c.devices[0].energy_j == pytest.approx(10.0 * c.period_s)


def test_predict_reads_a_split_output(chain, tmp_path):
    (tmp_path / "platform.txt").write_text(CHAIN_PLATFORM.format(extra=""))
    (tmp_path / "mapping.json").write_text(mapping_json({"d1_arm01": ["A", "B"],
                                                        "d2_arm0": ["C"]}))
    save_profile(CHAIN_PROFILE, tmp_path / "profile.json")
    split(chain, tmp_path / "mapping.json", tmp_path / "platform.txt", tmp_path / "out")
    assert predict(tmp_path / "out", tmp_path / "profile.json").throughput == pytest.approx(100.0)


def test_a_pair_without_link_figures_gets_gigabit_ethernet_and_a_note():
    timing = Timing(parse_platform_text("a, arm, slots=0\nb, arm, slots=0\n"), CHAIN_PROFILE)
    assert timing.links["a", "b"] == timing.links["b", "a"] == (125e6, 1e-4)
    assert timing.notes[0] == ("platform.txt: no bandwidth for a-b: assumed 1 Gbit/s Ethernet "
                               "with 0.1 ms latency (the paper's boards); add bandwidth=/latency= "
                               "to platform.txt or measure the links with `autodice profile "
                               "--inventory`")


def test_each_host_moves_its_own_ranks_tensors_at_its_own_memorys_speed():
    """Ranks on one host pass tensors through that host's memory: a Pi's shm figure is not a
    PC's, and the first profile's used to stand for every host's."""
    slow = replace(CHAIN_PROFILE, links={"shm": Link(1e8, 5e-5)})
    timing = Timing(parse_platform_text("pc, x86, slots=0-1\npi, arm, slots=0-1\n"),
                    {"pc": CHAIN_PROFILE, "pi": slow})
    assert timing.links["pc", "pc"] == (CHAIN_PROFILE.links["shm"].bandwidth,
                                        CHAIN_PROFILE.links["shm"].latency)
    assert timing.links["pi", "pi"] == (1e8, 5e-5)
    with pytest.raises(AutodiceError, match='profile of pi: no "shm" link'):
        Timing(parse_platform_text("pc, x86, slots=0-1\npi, arm, slots=0-1\n"),
               {"pc": CHAIN_PROFILE, "pi": replace(CHAIN_PROFILE, links={})})


def test_missing_inputs_are_named():
    platform = parse_platform_text("a, arm, slots=0\nb, arm, slots=0\n")
    with pytest.raises(AutodiceError, match="platform.txt: no profile for b "):
        Timing(platform, {"a": CHAIN_PROFILE})
    no_shm = Profile("m", "x", {}, {}, (1,), CHAIN_PROFILE.layers, {})
    with pytest.raises(AutodiceError, match='no "shm" link'):
        Timing(parse_platform_text("a, arm, slots=0\n"), no_shm)


def test_profile_of_another_model_is_rejected(chain, zoo_model):
    platform = parse_platform_text("h, x86, slots=0-1\n")
    with pytest.raises(AutodiceError, match=r"3 of 3 layers .* are not in it"):
        CostModel(load_model(chain), Timing(platform, fixture_profile(
            load_model(zoo_model("squeezenet")))))


def odd_model() -> onnx.ModelProto:
    """What the fast path must get right besides chains: a weight shared by two layers, a
    follower reading an activation (Shape of c), a model output also read by a later layer, a
    second model input read by two layers::

        x -> A: Relu -> a (output) -> B: MatMul w -> b -> C: Relu -> c -> D: MatMul w -> d
        a, c, z -> E: Sum -> e (output)      c -> Shape -> F: Reshape d -> f (output)
        z -> Z: Relu -> zr (output)
    """
    w = numpy_helper.from_array(np.eye(8, dtype=np.float32), "w")
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="A"),
             helper.make_node("MatMul", ["a", "w"], ["b"], name="B"),
             helper.make_node("Relu", ["b"], ["c"], name="C"),
             helper.make_node("MatMul", ["c", "w"], ["d"], name="D"),
             helper.make_node("Sum", ["a", "c", "z"], ["e"], name="E"),
             helper.make_node("Shape", ["c"], ["sh"], name="S"),
             helper.make_node("Reshape", ["d", "sh"], ["f"], name="F"),
             helper.make_node("Relu", ["z"], ["zr"], name="Z")]
    out = [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, 8])
           for t in ("a", "e", "f", "zr")]
    graph = helper.make_graph(nodes, "odd",
                              [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, 8])
                               for t in ("x", "z")], out, [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


ODD_PLATFORM = parse_platform_text(
    "p, arm, slots=0-2, gpu=V (CUDA), mem=1GB, power_idle=1W, power_cpu=1W, power_gpu=2W, "
    "bandwidth=10MB/s, latency=1ms\n"
    "q, x86, slots=0-1, gpu=W (VULKAN), gpu_mem=1GB, power_idle=5W, power_cpu=2W, "
    "bandwidth=100MB/s\n")


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    path = tmp_path_factory.mktemp("odd") / "odd.onnx"
    onnx.save(odd_model(), path)
    graph = load_model(path)
    timing = Timing(ODD_PLATFORM, fixture_profile(graph))
    return graph, timing, CostModel(graph, timing)


def assert_same(cm, graph, platform, timing, slots):
    """The fast path's cost of ``slots`` equals the plan's (the compiler's own passes)."""
    fast = cm.cost(slots)
    slow = plan_cost(plan_of(graph, platform, cm.mapping(slots)), timing, graph)
    assert [r.key for r in fast.ranks] == [r.key for r in slow.ranks]
    for f, s in zip(fast.ranks, slow.ranks):
        assert (f.memory, f.layers) == (s.memory, s.layers)
        assert f.compute_s == pytest.approx(s.compute_s, rel=1e-9)
        assert f.comm_s == pytest.approx(s.comm_s, rel=1e-9, abs=1e-15)
        assert f.span_s == pytest.approx(s.span_s, rel=1e-9)
    assert [(d.host, d.memory, d.ram, d.gpu_mem) for d in fast.devices] == \
        [(d.host, d.memory, d.ram, d.gpu_mem) for d in slow.devices]
    assert [d.energy_j for d in fast.devices] == pytest.approx([d.energy_j for d in slow.devices])
    assert fast.throughput == pytest.approx(slow.throughput, rel=1e-9)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fast_path_equals_plan_on_odd_graph(odd, data):
    graph, timing, cm = odd
    slots = data.draw(st.lists(st.integers(0, cm.n_slots - 1), min_size=cm.n_layers,
                               max_size=cm.n_layers))
    slots = np.array(slots)
    # Disjoint cores, as the search's decoding guarantees: "all" and "one"/"rest" never mix.
    kinds = {(cm.slots[s].dev, cm.slots[s].kind) for s in slots}
    assume(not any((d, "all") in kinds and ((d, "one") in kinds or (d, "rest") in kinds)
                   for d, _ in kinds))
    assert_same(cm, graph, ODD_PLATFORM, timing, slots)


def test_fast_path_equals_plan_on_zoo_models(zoo_model):
    rng = np.random.default_rng(0)
    platform = ODD_PLATFORM
    for name in ("squeezenet", "inception_v1"):
        graph = load_model(zoo_model(name))
        timing = Timing(platform, fixture_profile(graph))
        cm = CostModel(graph, timing)
        ok = [k for k, s in enumerate(cm.slots) if s.kind != "all"]
        X = np.empty((25, cm.n_layers), dtype=int)
        for i in range(len(X)):  # pipelines of random runs, some ping-ponging between ranks
            k = rng.integers(1, 7)
            starts = np.sort(rng.choice(np.arange(1, cm.n_layers), k - 1, replace=False))
            X[i] = rng.choice(ok, k)[np.searchsorted(starts, np.arange(cm.n_layers), "right")]
        batch = cm.evaluate(X)
        for i in range(len(X)):
            assert_same(cm, graph, platform, timing, X[i])
            assert batch.throughput[i] == pytest.approx(cm.cost(X[i]).throughput)
