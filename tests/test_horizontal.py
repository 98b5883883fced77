"""Horizontal partitioning (a layer under several keys) and data parallelism (stage copies): every
split rule against onnxruntime on small graphs with odd sizes, the plan saying who holds and sends
what, the clear errors, and real runs under mpirun on ncnn."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from test_backend import steady_fps

from autodice.backend.build import build
from autodice.backend.gen import gen
from autodice.backend.run import run
from autodice.core.errors import AutodiceError
from autodice.frontend.check import check
from autodice.frontend.split import split

PLATFORM = "e1, x86, slots=0-3\ne2, x86, slots=0-3\n"


def model(nodes, inputs, outputs, weights, opset=13):
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, weights),
                             opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def conv_stack(h: int = 13, width: int = 11, seed: int = 0) -> onnx.ModelProto:
    """A row-split workout::

        x (1x6xHxW) -> c1: Conv 3x3 pad 1 -> r1: Relu -> c2: Conv 3x3 stride 2 dilation 2
          pad (2,1,1,2) -> bn: BatchNormalization -> r2: Relu -> p: MaxPool 3x3 s2 ceil
          -> g: Conv 1x1 group 2 -> dw: Conv 3x3 depthwise pad 1 -> fc: Flatten+Gemm -> y
    """
    rng = np.random.default_rng(seed)

    def w(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    def pooled(n, pad):  # c2 (stride 2, dilation 2, pads summing to 3), then p (ceil mode)
        n = (n + pad - 5) // 2 + 1
        return -(-(n - 3) // 2) + 1

    weights = [w("w1", 8, 6, 3, 3), w("b1", 8), w("w2", 8, 8, 3, 3), w("g2", 8), w("be2", 8),
               w("m2", 8), numpy_helper.from_array(rng.uniform(0.5, 2, 8).astype(np.float32), "v2"),
               w("wg", 8, 4, 1, 1), w("wd", 8, 1, 3, 3),
               w("wf", 5, 8 * pooled(h, 3) * pooled(width, 3)), w("bf", 5)]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["a1"], name="c1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a1"], ["a2"], name="r1"),
        helper.make_node("Conv", ["a2", "w2"], ["a3"], name="c2", strides=[2, 2],
                         dilations=[2, 2], pads=[2, 1, 1, 2]),
        helper.make_node("BatchNormalization", ["a3", "g2", "be2", "m2", "v2"], ["a4"], name="bn"),
        helper.make_node("Relu", ["a4"], ["a5"], name="r2"),
        helper.make_node("MaxPool", ["a5"], ["a6"], name="p", kernel_shape=[3, 3],
                         strides=[2, 2], ceil_mode=1),
        helper.make_node("Conv", ["a6", "wg"], ["a7"], name="g", group=2),
        helper.make_node("Conv", ["a7", "wd"], ["a8"], name="dw", group=8, pads=[1, 1, 1, 1]),
        helper.make_node("Flatten", ["a8"], ["a9"], name="fl"),
        helper.make_node("Gemm", ["a9", "wf", "bf"], ["y"], name="fc", transB=1),
    ]
    return model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, h, width])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], weights)


ALL = ["c1", "r1", "c2", "bn", "r2", "p", "g", "dw", "fl", "fc"]


def write(tmp_path, proto, mapping) -> None:
    onnx.save(proto, tmp_path / "m.onnx")
    (tmp_path / "platform.txt").write_text(PLATFORM)
    (tmp_path / "mapping.json").write_text(json.dumps(mapping))


def split_and_check(tmp_path, proto, mapping, rtol=1e-5):
    write(tmp_path, proto, mapping)
    plan = split(tmp_path / "m.onnx", tmp_path / "mapping.json", tmp_path / "platform.txt",
                 tmp_path / "out")
    for d in check(tmp_path / "out", samples=2):
        assert d.rel < rtol, (d.name, d.rel)
    return plan


def one_key(layers, key="e1_x860"):
    return {key: list(layers)}


@pytest.mark.parametrize("shares", [None, (0.7, 0.3), (0.2, 0.3, 0.5)])
def test_rows_fused_over_a_run_of_layers_with_odd_sizes(tmp_path, shares):
    keys = ["e1_x860", "e1_x861", "e2_x860"][:len(shares or (1, 1))]
    run_of = ["c1", "r1", "c2", "r2", "p"]
    mapping = {k: [] for k in keys}
    for j, k in enumerate(keys):
        for layer in run_of:
            mapping[k].append({"layer": layer, "split": "rows",
                               **({"share": shares[j]} if shares else {})})
    mapping[keys[0]] += ["bn"]  # bn between c2 and r2 stays whole: gather, then split again
    mapping[keys[-1]] += ["g", "dw", "fl", "fc"]
    plan = split_and_check(tmp_path, conv_stack(), mapping)
    made = {n for r in plan.ranks for n in r.layers}
    assert {f"c1/{k}" for k in range(len(keys))} <= made
    assert all(plan.derived[f"c1/{k}"][0] == "c1" for k in range(len(keys)))
    if shares:  # uneven: the larger share does the larger band
        fractions = [plan.derived[f"c1/{k}"][1] for k in range(len(keys))]
        assert np.argmax(fractions) == np.argmax(shares)


def test_channels_for_conv_grouped_depthwise_gemm_and_their_per_channel_followers(tmp_path):
    keys = ["e1_x860", "e2_x860"]
    mapping = {keys[0]: ["c1", "r1", "c2", "bn", "r2", "p", "g", "dw", "fl", "fc"],
               keys[1]: ["c1", "r1", "c2", "bn", "r2", "g", "dw", "fc"]}
    plan = split_and_check(tmp_path, conv_stack(), mapping)
    # Each part holds only its slice of the weights: c1's 8x6x3x3 halves.
    held = {r.key: r.memory.params for r in plan.ranks}
    whole = 4 * (8 * 6 * 9 + 8 + 8 * 8 * 9 + 4 * 8 + 8 * 4 + 8 * 9 + 5 * 48 + 5)
    assert sum(held.values()) < whole * 1.1 and max(held.values()) < whole * 0.75


def test_matmul_and_gemm_without_transpose_split_their_columns(tmp_path):
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((12, 7)).astype(np.float32), "w")
    w2 = numpy_helper.from_array(rng.standard_normal((7, 9)).astype(np.float32), "w2")
    c = numpy_helper.from_array(rng.standard_normal(9).astype(np.float32), "c")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["hr"], name="relu"),
             helper.make_node("Gemm", ["hr", "w2", "c"], ["y"], name="gemm")]
    proto = model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 12])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 9])], [w, w2, c])
    plan = split_and_check(tmp_path, proto, {"e1_x860": ["mm", "relu", "gemm"],
                                             "e1_x861": ["mm", "relu", "gemm"],
                                             "e2_x862": ["gemm"]})
    made = [sorted(n for n in r.layers if n.startswith(("mm/", "gemm/"))) for r in plan.ranks]
    assert made == [["gemm/0", "mm/0"], ["gemm/1", "mm/1"], ["gemm/2"]], made


def residual_block(h: int = 11, seed: int = 2) -> onnx.ModelProto:
    """A bottleneck's shape: one tensor read by two branches, joined by an Add::

        x -> c0: Conv 3x3 pad 1 -> r0: Relu = a0
        a0 -> c1: Conv 3x3 pad 1 -> r1: Relu -> c2: Conv 1x1 = b
        a0 -> cs: Conv 1x1 stride 1 (shortcut) = s
        b + s -> add -> ra: Relu -> sc: Mul by a 1x6x1x1 constant -> cat: Concat with a0
          over channels (a dense block's join) -> p: MaxPool 2x2 s2 -> y
    """
    rng = np.random.default_rng(seed)

    def w(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"], name="c0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["a0"], name="r0"),
        helper.make_node("Conv", ["a0", "w1"], ["b1"], name="c1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["b1"], ["b2"], name="r1"),
        helper.make_node("Conv", ["b2", "w2"], ["b"], name="c2"),
        helper.make_node("Conv", ["a0", "ws"], ["s"], name="cs"),
        helper.make_node("Add", ["b", "s"], ["t"], name="add"),
        helper.make_node("Relu", ["t"], ["u"], name="ra"),
        helper.make_node("Mul", ["u", "scale"], ["v"], name="sc"),
        helper.make_node("Concat", ["v", "a0"], ["z"], name="cat", axis=1),
        helper.make_node("MaxPool", ["z"], ["y"], name="p", kernel_shape=[2, 2], strides=[2, 2]),
    ]
    weights = [w("w0", 6, 3, 3, 3), w("w1", 6, 6, 3, 3), w("w2", 6, 6, 1, 1), w("ws", 6, 6, 1, 1),
               w("scale", 1, 6, 1, 1)]
    return model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, h, h])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 12, h // 2, h // 2])],
                 weights)


BLOCK = ["c0", "r0", "c1", "r1", "c2", "cs", "add", "ra", "sc", "cat", "p"]


@pytest.mark.parametrize("whole", [(), ("cs",), ("add",), ("c1", "r1"), ("cat",)])
def test_rows_through_a_residual_block_a_tensor_read_twice(tmp_path, whole):
    """Both branches keep their bands and the Add adds band to band; a layer left whole between
    split ones gathers what it reads without taking the bands from the other branch."""
    keys = ["e1_x860", "e1_x861", "e2_x860"]
    mapping = {k: [] for k in keys}
    for layer in BLOCK:
        if layer in whole:
            mapping[keys[0]].append(layer)
        else:
            for k in keys:
                mapping[k].append({"layer": layer, "split": "rows"})
    plan = split_and_check(tmp_path, residual_block(), mapping)
    made = {n for r in plan.ranks for n in r.layers}
    for layer in ("add", "cat"):
        if layer not in whole:
            assert {f"{layer}/0", f"{layer}/1", f"{layer}/2"} <= made
    if not whole:  # bands all the way: the whole of a0 is never made
        assert not any(n.startswith("a0/gather") for n in made)


def pool(op: str, h: int, w: int, **attrs) -> onnx.ModelProto:
    """x (1x2xHxW) -> p: ``op`` 3x3 stride 2 with ``attrs`` -> y."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, h, w])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node(op, ["x"], ["y"], name="p", kernel_shape=[3, 3], strides=[2, 2],
                            **attrs)
    return onnx.shape_inference.infer_shapes(model([node], [x], [y], []))


@pytest.mark.parametrize("op, h, w, attrs", [
    ("MaxPool", 8, 8, {"ceil_mode": 1}),  # GoogLeNet's pools: the last column a part window
    ("MaxPool", 9, 10, {"ceil_mode": 1, "pads": [1, 0, 0, 1]}),
    ("AveragePool", 8, 7, {"ceil_mode": 1, "pads": [1, 1, 1, 1]}),
    ("AveragePool", 9, 9, {"ceil_mode": 1, "pads": [1, 1, 1, 1], "count_include_pad": 1}),
])
def test_pools_in_ceil_mode_by_rows_like_onnxruntime(tmp_path, op, h, w, attrs):
    """The part windows at the bottom and the right, rows and columns alike (the columns' was
    dropped: the parts came out a column short)."""
    rows = {"layer": "p", "split": "rows"}
    plan = split_and_check(tmp_path, pool(op, h, w, **attrs),
                           {"e1_x860": [rows], "e2_x860": [rows]})
    assert [[n for n in r.layers if n.startswith("p")] for r in plan.ranks] == [["p/0"], ["p/1"]]


def test_an_average_pool_whose_part_windows_count_padding_is_not_split_by_rows(tmp_path):
    """onnxruntime divides a part window by the window up to the padding's edge; a band's
    explicit pads would count the rows past it too (it split, 24 % off)."""
    rows = {"layer": "p", "split": "rows"}
    write(tmp_path, pool("AveragePool", 8, 7, ceil_mode=1, pads=[1, 1, 1, 1],
                         count_include_pad=1), {"e1_x860": [rows], "e2_x860": [rows]})
    with pytest.raises(AutodiceError, match="AveragePool in ceil_mode that counts padding"):
        split(tmp_path / "m.onnx", tmp_path / "mapping.json", tmp_path / "platform.txt",
              tmp_path / "out")


@pytest.mark.parametrize("attrs", [{"count_include_pad": 0}, {"count_include_pad": 1}])
def test_an_average_pool_padded_one_side_in_ceil_mode_like_onnxruntime(tmp_path, attrs):
    """Inception-v1's pool padded bottom and right only, spelled for pnnx: the window past the
    padding in ceil mode too (it was dropped: a smaller output, an invalid sub-model)."""
    split_and_check(tmp_path, pool("AveragePool", 7, 7, ceil_mode=1, pads=[0, 0, 1, 1], **attrs),
                    one_key(["p"]))


def test_layers_of_one_name_keep_their_names_when_one_is_split(tmp_path):
    """An unnamed Conv writing "h" and a Relu named "h" are layers h and h_1 (a layer is named
    by its node, else its output); splitting h made h_1 "not in the model": the names were
    counted again without it."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((8, 4, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["h"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["h"], ["y"], name="h")]
    plan = split_and_check(tmp_path, model(nodes, [x], [y], [w]),
                           {"e1_x860": ["h"], "e2_x860": ["h", "h_1"]})
    assert "h_1" in plan.ranks[1].layers


@pytest.mark.parametrize("mapping, problem", [
    ({"e1_x860": ["c1", "r1", "c2", "bn", "r2", "p", "g", "dw", "fl", "fc"],
      "e1_x861": [{"layer": "fl", "split": "rows"}]}, 'layer "fl" cannot be split'),
    ({"e1_x860": ALL, "e1_x861": ["fc"], "e1_x862": ["fc"], "e1_x863": ["fc"],
      "e2_x860": ["fc"], "e2_x861": ["fc"], "e2_x862": ["fc"]}, "a finer split than"),
    ({"e1_x860": ALL, "e1_x861": [{"layer": "c1", "split": "diagonal"}]},
     'split "diagonal" is not'),
    ({"e1_x860": ALL, "e1_x861": [{"layer": "c1", "share": -1}]}, "must be a positive finite"),
    ({"e1_x860": ALL, "e1_x861": [{"layer": "c1", "share": float("inf")}]},
     "share inf must be a positive finite"),
    ({"e1_x860": ALL, "e1_x861": [{"layer": "c1", "split": "rows"}],
      "e2_x860": [{"layer": "c1", "split": "channels"}]}, "split as channels and rows"),
    ({"e1_x860": ALL, "e1_x861": {"replicates": "e9_x860"}}, 'replicates "e9_x860"'),
])
def test_what_cannot_be_split_is_one_line_naming_layer_and_key(tmp_path, mapping, problem):
    write(tmp_path, conv_stack(), mapping)
    with pytest.raises(AutodiceError) as e:
        split(tmp_path / "m.onnx", tmp_path / "mapping.json", tmp_path / "platform.txt",
              tmp_path / "out")
    assert any(problem in p for p in e.value.problems), e.value.problems
    assert not (tmp_path / "out").exists()


def test_replicas_are_ranks_of_their_own_in_the_plan_and_tables(tmp_path):
    mapping = {"e1_x860": ["c1", "r1", "c2", "bn"], "e1_x861": ["r2", "p", "g", "dw"],
               "e2_x860": {"replicates": "e1_x861"}, "e2_x861": ["fl", "fc"]}
    plan = split_and_check(tmp_path, conv_stack(), mapping)
    assert [r.key for r in plan.ranks] == list(mapping)
    assert [r.replicas for r in plan.ranks] == [(), (1, 2), (1, 2), ()]
    assert plan.ranks[2].layers == plan.ranks[1].layers
    assert plan.ranks[2].memory == plan.ranks[1].memory  # a copy holds all the weights
    assert (tmp_path / "out" / "models" / "e2_x860.onnx").exists()
    sender = json.loads((tmp_path / "out" / "sender.json").read_text())
    receiver = json.loads((tmp_path / "out" / "receiver.json").read_text())
    assert sender["0"] == {"a4": ["1", "2"]}  # frame by frame to one copy or the other
    assert receiver["3"] == {"a8": ["1", "2"]} and sender["1"] == sender["2"] == {"a8": ["3"]}


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.data())
def test_random_mappings_mixing_all_three_kinds(tmp_path_factory, data):
    keys = ["e1_x860", "e1_x861", "e2_x860", "e2_x861"]
    mapping: dict[str, list] = {k: [] for k in keys}
    for layer in ALL:
        n = data.draw(st.integers(1, 2), label=f"{layer} parts")
        where = data.draw(st.lists(st.sampled_from(keys), min_size=n, max_size=n, unique=True))
        kind = data.draw(st.sampled_from(["", "rows", "channels"]))
        for k in where:
            mapping[k].append({"layer": layer, "split": kind} if n > 1 and kind else layer)
    used = [k for k in keys if mapping[k]]
    free = [k for k in keys if not mapping[k]]
    if free and data.draw(st.booleans(), label="replica"):
        mapping[free[0]] = {"replicates": data.draw(st.sampled_from(used))}
    mapping = {k: v for k, v in mapping.items() if v}
    tmp = tmp_path_factory.mktemp("mix")
    write(tmp, conv_stack(), mapping)
    try:
        split(tmp / "m.onnx", tmp / "mapping.json", tmp / "platform.txt", tmp / "out")
    except AutodiceError as e:  # a rule that does not apply is refused, never wrongly split
        assert all("cannot be split" in p or "split as" in p for p in e.problems), e.problems
        return
    for d in check(tmp / "out"):
        assert d.rel < 1e-5, (mapping, d)


@pytest.mark.cpp
def test_resnet50_stem_and_first_bottleneck_by_rows_like_onnxruntime(tmp_path):
    """The zoo's ResNet-50 is opset 9, where Slice and Pad take their bounds as attributes: the
    bands' Slices must be spelled so (onnx's shape inference refused the opset-10 form). Its
    stem pool's bands pad unevenly, which pnnx converts wrongly unless a Concat of constant rows
    does it; gen checks every conversion in ncnn against onnxruntime."""
    from autodice.core.model import load_model
    from autodice.frontend.layers import layer_table
    from autodice.frontend.zoo import cached

    names = [r["name"] for r in layer_table(load_model(cached("resnet50"))) if not r["follows"]]
    block = [{"layer": n, "split": "rows"} for n in names[:16]]
    mapping = {"e1_x860": block, "e1_x861": block, "e2_x860": names[16:]}
    (tmp_path / "mapping.json").write_text(json.dumps(mapping))
    (tmp_path / "platform.txt").write_text(PLATFORM)
    plan = split(cached("resnet50"), tmp_path / "mapping.json", tmp_path / "platform.txt",
                 tmp_path / "out")
    assert [r.key for r in plan.ranks] == ["e1_x860", "e1_x861", "e2_x860"]
    for d in check(tmp_path / "out", samples=1):
        assert d.rel < 1e-5, (d.name, d.rel)
    gen(tmp_path / "out", precision="fp32")


@pytest.mark.cpp
def test_split_layers_and_a_replicated_stage_run_on_ncnn_like_onnxruntime(tmp_path):
    mapping = {"e1_x860": [{"layer": x, "split": "rows"} for x in ("c1", "r1", "c2")],
               "e1_x861": [{"layer": x, "split": "rows"} for x in ("c1", "r1", "c2")] + [
                   "bn", "r2", "p"],
               "e2_x860": ["g", "dw", "fl", "fc"], "e2_x861": {"replicates": "e2_x860"}}
    plan = split_and_check(tmp_path, conv_stack(), mapping)
    gen(tmp_path / "out")
    build(tmp_path / "out")
    x = np.random.default_rng(5).standard_normal((1, 6, 13, 11)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    res = run(tmp_path / "out", {"x": tmp_path / "x.npy"}, frames=5)
    import onnxruntime as ort
    want = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"x": x})[0]
    np.testing.assert_allclose(res.outputs["y"], want, rtol=1e-4, atol=1e-4)
    frames = [r["frames"] for r in res.stats["ranks"]]
    assert frames == [5, 5, 3, 2]  # the copies took turns: frames 0, 2, 4 and 1, 3
    # Both copies write y, each at its own pace: the job's steady rate is their sum.
    assert res.stats["steady_fps"] == pytest.approx(steady_fps(tmp_path / "out", res.stats),
                                                    rel=1e-3)
    assert len(plan.ranks) == 4


def test_the_cost_model_prices_parts_and_copies(tmp_path):
    """A part costs its share of the layer; a stage with two copies handles half the frames
    on each, so a bottleneck stage copied onto idle cores nearly doubles the throughput."""
    from test_cost import fixture_profile

    from autodice.core.mapping import parse_mapping_text
    from autodice.core.model import load_model
    from autodice.core.spec import parse_platform_text
    from autodice.dse.cost import plan_cost
    from autodice.dse.timing import Timing
    from autodice.frontend.split import partition_mapping

    onnx.save(conv_stack(h=64, width=64), tmp_path / "m.onnx")
    graph = load_model(tmp_path / "m.onnx")
    platform = parse_platform_text(PLATFORM)
    timing = Timing(platform, fixture_profile(graph))

    def cost(mapping):
        done = partition_mapping(graph, parse_mapping_text(json.dumps(mapping)), platform,
                                 tmp_path)
        return plan_cost(done.plan, timing, done.graph)

    heavy = ["c1", "r1", "c2", "bn", "r2"]
    light = ["p", "g", "dw", "fl", "fc"]
    alone = cost({"e1_x860": heavy, "e2_x860": light})
    copied = cost({"e1_x860": heavy, "e1_x861": {"replicates": "e1_x860"}, "e2_x860": light})
    assert 1.6 < copied.throughput / alone.throughput <= 2.0
    assert copied.ranks[1].memory == copied.ranks[0].memory  # each copy holds the weights
    halves = cost({"e1_x860": heavy, "e1_x861": ["c1", "c2"], "e2_x860": light})
    c1 = {r.key: r.compute_s for r in halves.ranks}
    assert c1["e1_x861"] < c1["e1_x860"] and halves.throughput > alone.throughput


def test_the_fullest_boards_largest_weights_are_spread_when_every_resource_is_in_use(tmp_path):
    """Searched points often use every resource: a share of a layer needs no idle core, and a
    leaner proposal stands even where it is slower (the front sorts it out)."""
    from test_cost import fixture_profile

    from autodice.core.model import load_model
    from autodice.core.spec import parse_platform
    from autodice.dse.expand import _price, expand
    from autodice.dse.front import Point
    from autodice.dse.timing import make_timing

    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((4096, 256)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((10, 4096)).astype(np.float32), "w2")
    onnx.save(model([helper.make_node("Gemm", ["x", "w1"], ["h"], name="fc1", transB=1),
                     helper.make_node("Relu", ["h"], ["a"], name="r"),
                     helper.make_node("Gemm", ["a", "w2"], ["y"], name="fc2", transB=1)],
                    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                    [w1, w2]), tmp_path / "m.onnx")
    (tmp_path / "platform.txt").write_text("e1, x86, slots=0\ne2, x86, slots=0\n")
    graph = load_model(tmp_path / "m.onnx")
    timing = make_timing(parse_platform(tmp_path / "platform.txt"), fixture_profile(graph))
    mapping = {"e1_x860": ["fc1"], "e2_x860": ["r", "fc2"]}  # every core in use
    start = Point("p0", mapping, _price(mapping, graph, timing.platform, timing, "fp32"))
    grown = expand((start,), graph, timing.platform, timing, ("horizontal",), steps=1)
    assert [p.name for p in grown] == ["p0+spread:e2_x860"]
    assert grown[0].mapping == {"e1_x860": ["fc1"], "e2_x860": ["r", "fc2", "fc1"]}
    assert grown[0].cost.max_memory < start.cost.max_memory


def test_the_search_proposes_copies_and_split_layers_that_pay(tmp_path):
    """With idle resources, copying the bottleneck stage or splitting its heaviest layer beats
    every vertical mapping on throughput; each proposal is a mapping split accepts."""
    from test_cost import fixture_profile

    import autodice
    from autodice.core.model import load_model

    onnx.save(conv_stack(h=96, width=96), tmp_path / "m.onnx")
    (tmp_path / "platform.txt").write_text(
        "e1, x86, slots=0-1, bandwidth=10gbit\ne2, x86, slots=0-1, bandwidth=10gbit\n")
    profile = fixture_profile(load_model(tmp_path / "m.onnx"))
    plain = autodice.search(tmp_path / "m.onnx", tmp_path / "platform.txt", profile,
                            objectives=("throughput", "memory"), pop=12, gens=6)
    more = autodice.search(tmp_path / "m.onnx", tmp_path / "platform.txt", profile,
                           objectives=("throughput", "memory"), pop=12, gens=6,
                           parallel=("data", "horizontal"), out=tmp_path / "front")
    proposed = [p for p in more.points if p.proposed]
    assert proposed and more.points[0].cost.throughput > plain.points[0].cost.throughput
    for p in proposed:  # written as mappings split takes, and planned the same
        mapping = tmp_path / "front" / "mappings" / f"{p.name}.json"
        got = split(tmp_path / "m.onnx", mapping, tmp_path / "platform.txt", tmp_path / p.name)
        assert len(got.ranks) == len(p.cost.ranks)
