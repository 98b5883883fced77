"""The rules of ``frontend/exporters.py`` proven on the operation, not on one test's spelling:
for random shapes and attributes, onnxruntime computes the same on the rewrite as on the node
(bit for bit for data movement, within float rounding where the rewrite sums or divides).

    x (random static shape) --OP(random attributes, random weights)--> y

That the rewrites then convert right in ncnn is ``test_conformance.py``'s to show.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from autodice.core.model import load_model
from autodice.frontend.exporters import respell
from autodice.frontend.legalize import lowest_equivalent_opset

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def model_of(node, x_shape, weights: dict[str, np.ndarray], opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, x_shape)], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8)


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def check(tmp_path, model: onnx.ModelProto, x_shape, exact: bool, rewritten: bool = True):
    """The node's rewrite computes what the node does (and it was rewritten, if ``rewritten``)."""
    onnx.save(model, tmp_path / "m.onnx")
    graph = load_model(tmp_path / "m.onnx")
    opset = model.opset_import[0].version
    nodes = respell(graph, model.graph.node[0], opset)
    assert (nodes is not None) == rewritten, model.graph.node[0]
    if nodes is None:
        return
    new = onnx.ModelProto()
    new.CopyFrom(model)
    del new.graph.node[:]
    new.graph.node.extend(nodes)
    x = np.random.default_rng(1).standard_normal(x_shape).astype(np.float32)
    want, got = run(model, x), run(new, x)
    assert want.shape == got.shape
    if exact:
        assert np.array_equal(want, got)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@st.composite
def padded(draw):
    op = draw(st.sampled_from(["Conv", "ConvTranspose", "AveragePool"]))  # (pnnx: MaxPool's)
    mode = draw(st.sampled_from(["SAME_UPPER", "SAME_LOWER", "VALID"]))
    c, size = draw(st.integers(1, 3)), [draw(st.integers(3, 9)) for _ in range(2)]
    kernel = [draw(st.integers(1, 3)) for _ in range(2)]
    # A stride past the kernel makes SAME's padding negative, which onnxruntime refuses.
    strides = [draw(st.integers(1, k)) for k in kernel]
    attrs = {"auto_pad": mode, "strides": strides}
    weights = {}
    if op in ("Conv", "ConvTranspose"):
        channels = (2, c) if op == "Conv" else (c, 2)  # out x in, or in x out
        weights["w"] = np.random.default_rng(0).standard_normal((*channels, *kernel)).astype(
            np.float32)
        if op == "Conv" and mode == "VALID":  # (onnxruntime has SAME without dilations only)
            attrs["dilations"] = [draw(st.integers(1, 2)) if 2 * k - 1 <= n else 1
                                  for k, n in zip(kernel, size)]
    else:
        attrs["kernel_shape"] = kernel
        if op == "AveragePool":
            attrs["count_include_pad"] = draw(st.integers(0, 1))
    node = helper.make_node(op, ["x", *weights], ["y"], name="n", **attrs)
    return node, (1, c, *size), weights


@SETTINGS
@given(case=padded())
def test_auto_pad_becomes_the_pads_the_spec_computes(tmp_path, case):
    node, shape, weights = case
    check(tmp_path, model_of(node, shape, weights), shape, exact=node.op_type != "AveragePool")


def test_conv_transpose_output_shape_becomes_pads_and_output_padding(tmp_path):
    w = np.random.default_rng(0).standard_normal((1, 2, 3, 3)).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="n", strides=[3, 2],
                            output_shape=[10, 8])
    check(tmp_path, model_of(node, (1, 1, 3, 3), {"w": w}), (1, 1, 3, 3), exact=True)


@st.composite
def gemms(draw):
    m, k, n = draw(st.integers(2, 5)), draw(st.integers(1, 5)), draw(st.integers(1, 5))
    trans_a, trans_b = draw(st.integers(0, 1)), draw(st.integers(0, 1))
    rng = np.random.default_rng(0)
    weights = {"b": rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)}
    bias = draw(st.sampled_from([None, (1,), (n,), (1, n), (m, 1), (m, n)]))
    if bias is not None:
        weights["c"] = rng.standard_normal(bias).astype(np.float32)
    attrs = {"transA": trans_a, "transB": trans_b,
             "alpha": draw(st.sampled_from([1.0, 0.5, 2.0])),
             "beta": draw(st.sampled_from([1.0, 0.25, -1.0]))}
    node = helper.make_node("Gemm", ["x", *weights], ["y"], name="n", **attrs)
    return node, (k, m) if trans_a else (m, k), weights


@SETTINGS
@given(case=gemms())
def test_gemm_on_rows_becomes_matmul(tmp_path, case):
    node, shape, weights = case
    check(tmp_path, model_of(node, shape, weights), shape, exact=False)


@st.composite
def pools(draw):
    op = draw(st.sampled_from(["MaxPool", "AveragePool"]))
    c, size = draw(st.integers(1, 3)), [draw(st.integers(4, 10)) for _ in range(2)]
    kernel = [draw(st.integers(1, 3)) for _ in range(2)]
    dil = [draw(st.integers(1, 3)) for _ in range(2)]
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]
    pads = [draw(st.integers(0, k - 1)) for k in kernel + kernel]  # (onnxruntime: below k)
    attrs = {"kernel_shape": kernel, "dilations": dil, "pads": pads,
             "strides": [draw(st.integers(1, 3)) for _ in range(2)],
             "ceil_mode": draw(st.integers(0, 1))}
    if op == "AveragePool":
        attrs["count_include_pad"] = draw(st.integers(0, 1))
    if spans[0] > size[0] + pads[0] + pads[2] or spans[1] > size[1] + pads[1] + pads[3]:
        attrs["dilations"] = [1, 1]
    return helper.make_node(op, ["x"], ["y"], name="n", **attrs), (1, c, *size)


@SETTINGS
@given(case=pools())
def test_dilated_or_ceil_pooling_by_convolution(tmp_path, case):
    node, shape = case
    model = model_of(node, shape, {}, opset=19)
    onnx.save(model, tmp_path / "m.onnx")
    from autodice.frontend.pooling import _needs_own_pooling

    graph = load_model(tmp_path / "m.onnx")
    # Where onnx's shape inference and onnxruntime disagree (a window wholly past the input,
    # which onnxruntime keeps in ceil mode), the model is not one a plan can be made of.
    assume(tuple(graph.types["y"].shape) == run(model, np.zeros(shape, np.float32)).shape)
    needed = _needs_own_pooling(graph, node)
    check(tmp_path, model, shape, exact=node.op_type == "MaxPool", rewritten=needed)


@SETTINGS
@given(slope=st.sampled_from([(5,), (4, 5), (3, 4, 5), (1, 1, 5), (1,), (3, 1, 1)]))
def test_prelu_of_any_slope(tmp_path, slope):
    w = {"s": np.random.default_rng(2).standard_normal(slope).astype(np.float32)}
    node = helper.make_node("PRelu", ["x", "s"], ["y"], name="n")
    check(tmp_path, model_of(node, (1, 3, 4, 5), w), (1, 3, 4, 5), exact=True,
          rewritten=slope not in ((1,), (3, 1, 1)))


@SETTINGS
@given(shape=st.sampled_from([(2, 3, 4, 5), (1, 3, 4, 5), (3, 5), (2, 3, 5), (1, 6, 8)]),
       axis=st.integers(-4, 3), opset=st.sampled_from([17, 18]), bias=st.booleans())
def test_layer_normalization_by_reductions(tmp_path, shape, axis, opset, bias):
    axis = axis % len(shape)
    rng = np.random.default_rng(3)
    w = {"scale": rng.standard_normal(shape[axis:]).astype(np.float32)}
    if bias:
        w["bias"] = rng.standard_normal(shape[axis:]).astype(np.float32)
    node = helper.make_node("LayerNormalization", ["x", *w], ["y"], name="n", axis=axis,
                            epsilon=1e-3)
    check(tmp_path, model_of(node, shape, w, opset), shape, exact=False,
          rewritten=not (shape[0] == 1 and axis == len(shape) - 1))


@SETTINGS
@given(shape=st.lists(st.integers(1, 6), min_size=2, max_size=5).map(tuple),
       eps=st.sampled_from([1e-5, 1e-3, 0.1]), opset=st.sampled_from([9, 15]))
def test_batch_normalization_off_the_batch_by_scale_and_shift(tmp_path, shape, eps, opset):
    """LeViT's tokens flattened to N x C: BatchNormalization there is x * scale + shift per
    channel; on a batch of one (pnnx's own BatchNorm) it is left alone."""
    rng = np.random.default_rng(4)
    c = shape[1]
    w = {"gamma": rng.standard_normal(c), "beta": rng.standard_normal(c),
         "mean": rng.standard_normal(c), "var": 0.1 + rng.random(c)}
    w = {k: v.astype(np.float32) for k, v in w.items()}
    node = helper.make_node("BatchNormalization", ["x", *w], ["y"], name="n", epsilon=eps)
    check(tmp_path, model_of(node, shape, w, opset), shape, exact=False,
          rewritten=shape[0] != 1)


@SETTINGS
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple), data=st.data(),
       keep=st.integers(0, 1), opset=st.sampled_from([13, 17, 18]))
def test_reduce_sum_over_constant_axes_by_mean(tmp_path, shape, data, keep, opset):
    axes = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1,
                              max_size=len(shape), unique_by=lambda a: a % len(shape)))
    w = {"axes": np.array(axes, np.int64)}
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="n", keepdims=keep)
    check(tmp_path, model_of(node, shape, w, opset), shape, exact=False)


@SETTINGS
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple), data=st.data(),
       keep=st.integers(0, 1), opset=st.sampled_from([13, 17, 18]))
def test_reduce_l2_by_a_sum_of_squares(tmp_path, shape, data, keep, opset):
    """Over any axes, the attribute's (to opset 17) or the input's (18), but the channels of a
    4-D tensor alone, the one ``F.normalize`` pnnx converts right."""
    axes = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1,
                              max_size=len(shape), unique_by=lambda a: a % len(shape)))
    if opset >= 18:
        w = {"axes": np.array(axes, np.int64)}
        node = helper.make_node("ReduceL2", ["x", "axes"], ["y"], name="n", keepdims=keep)
    else:
        w = {}
        node = helper.make_node("ReduceL2", ["x"], ["y"], name="n", axes=axes, keepdims=keep)
    channels = len(shape) == 4 and [a % 4 for a in axes] == [1]
    check(tmp_path, model_of(node, shape, w, opset), shape, exact=False, rewritten=not channels)


@SETTINGS
@given(shape=st.lists(st.integers(1, 6), min_size=3, max_size=4).map(tuple),
       eps=st.sampled_from([1e-5, 0.1]))
def test_instance_normalization_of_3d_on_a_4d_view(tmp_path, shape, eps):
    """torch's GroupNorm as exported (MobileViT-v2): InstanceNormalization of N x C x L."""
    rng = np.random.default_rng(5)
    w = {k: rng.standard_normal(shape[1]).astype(np.float32) for k in ("scale", "bias")}
    node = helper.make_node("InstanceNormalization", ["x", *w], ["y"], name="n", epsilon=eps)
    check(tmp_path, model_of(node, shape, w), shape, exact=False, rewritten=len(shape) == 3)


def space_to_depth(x: np.ndarray, b: int, crd: bool) -> np.ndarray:
    """The spec's SpaceToDepth, element by element (onnxruntime reads opset 26 at most, and the
    CRD mode came with 28)."""
    n, c, h, w = x.shape
    y = np.empty((n, c * b * b, h // b, w // b), x.dtype)
    for ch in range(c):
        for i in range(b):
            for j in range(b):
                k = ch * b * b + i * b + j if crd else (i * b + j) * c + ch
                y[:, k] = x[:, ch, i::b, j::b]
    return y


@SETTINGS
@given(op=st.sampled_from(["DepthToSpace", "SpaceToDepth"]), mode=st.sampled_from(["DCR", "CRD"]),
       b=st.integers(1, 3), c=st.integers(1, 3), h=st.integers(1, 3), w=st.integers(1, 3))
def test_depth_and_space_by_transposes(tmp_path, op, mode, b, c, h, w):
    shape = (1, c * b * b, h, w) if op == "DepthToSpace" else (1, c, h * b, w * b)
    if op == "DepthToSpace":
        node = helper.make_node(op, ["x"], ["y"], name="n", blocksize=b, mode=mode)
        check(tmp_path, model_of(node, shape, {}, 13), shape, exact=True)
        return
    node = helper.make_node(op, ["x"], ["y"], name="n", blocksize=b, mode=mode)
    model = model_of(node, shape, {}, 28)
    onnx.save(model, tmp_path / "m.onnx")
    new = onnx.ModelProto()
    new.CopyFrom(model)
    del new.graph.node[:]
    new.graph.node.extend(respell(load_model(tmp_path / "m.onnx"), node, 28))
    new.opset_import[0].version = 17
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    assert np.array_equal(run(new, x), space_to_depth(x, b, mode == "CRD"))


def test_selu_and_a_transpose_without_perm(tmp_path):
    selu = helper.make_node("Selu", ["x"], ["y"], name="n", alpha=2.0, gamma=3.0)
    check(tmp_path, model_of(selu, (3, 4, 5), {}), (3, 4, 5), exact=False)
    check(tmp_path, model_of(helper.make_node("Selu", ["x"], ["y"], name="n"), (3, 4), {}),
          (3, 4), exact=True, rewritten=False)
    t = helper.make_node("Transpose", ["x"], ["y"], name="n")
    check(tmp_path, model_of(t, (2, 3, 4), {}), (2, 3, 4), exact=True)


def test_the_lowest_opset_that_means_the_same():
    def lowest(op: str, opset: int, **attrs) -> int:
        if op in ("DepthToSpace", "SpaceToDepth"):
            attrs["blocksize"] = 2
        m = helper.make_model(helper.make_graph(
            [helper.make_node(op, ["x"], ["y"], **attrs)], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 2, 2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
            opset_imports=[helper.make_opsetid("", opset)])
        lowest_equivalent_opset(m)
        return m.opset_import[0].version

    assert lowest("DepthToSpace", 28) == 22  # 28 added types only: IR 14 is not needed
    assert lowest("Softmax", 28) == 22  # (not below what every reader takes)
    assert lowest("SpaceToDepth", 28) == 28  # 28 added the mode
    assert lowest("Flatten", 25, axis=-1) == 22  # (its negative axes came with 11)
    assert lowest("Relu", 12) == 12  # read everywhere as it is


@SETTINGS
@given(op=st.sampled_from(["Max", "Min", "Sum", "Mean"]), extra=st.integers(0, 3))
def test_many_inputs_become_a_chain_of_pairs(tmp_path, op, extra):
    rng = np.random.default_rng(4)
    w = {f"w{k}": rng.standard_normal((3, 1) if k % 2 else (4,)).astype(np.float32)
         for k in range(extra)}
    node = helper.make_node(op, ["x", *w], ["y"], name="n")
    check(tmp_path, model_of(node, (3, 4), w), (3, 4), exact=op != "Mean",
          rewritten=extra != 1)


@SETTINGS
@given(shape=st.sampled_from([(6,), (2, 6), (1, 3, 7, 2)]), axis=st.integers(-1, 0),
       parts=st.integers(1, 4), opset=st.sampled_from([13, 18]))
def test_split_becomes_slices(tmp_path, shape, axis, parts, opset):
    n = shape[axis]
    sizes = [n // parts + (1 if k < n % parts else 0) for k in range(parts)]
    assume(all(sizes))
    chunk = -(-n // parts)  # opset 18's num_outputs: parts of ceil(n / parts), the last less
    assume(opset == 13 or n - chunk * (parts - 1) > 0)
    w = {"s": np.array(sizes, np.int64)} if opset == 13 else {}
    attrs = {"axis": axis} if opset == 13 else {"axis": axis, "num_outputs": parts}
    outs = [f"y{k}" for k in range(parts)]
    node = helper.make_node("Split", ["x", *w], outs, name="n", **attrs)
    model = model_of(node, shape, w, opset)
    del model.graph.output[:]
    model.graph.output.extend(helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                              for o in outs)
    onnx.save(model, tmp_path / "m.onnx")
    nodes = respell(load_model(tmp_path / "m.onnx"), node, opset)
    new = onnx.ModelProto()
    new.CopyFrom(model)
    del new.graph.node[:]
    new.graph.node.extend(nodes)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    sess = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
            for m in (model, new)]
    for want, got in zip(*(s.run(None, {"x": x}) for s in sess)):
        assert np.array_equal(want, got)


def test_tile_dropout_and_a_cropped_conv_transpose(tmp_path):
    tile = helper.make_node("Tile", ["x", "r"], ["y"], name="n")
    check(tmp_path, model_of(tile, (2, 3), {"r": np.array([3, 2], np.int64)}), (2, 3),
          exact=True)
    drop = helper.make_node("Dropout", ["x"], ["y"], name="n", ratio=0.3)
    check(tmp_path, model_of(drop, (2, 3), {}, 10), (2, 3), exact=True)
    w = np.random.default_rng(0).standard_normal((1, 2, 3, 3)).astype(np.float32)
    conv = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="n", strides=[2, 2],
                            pads=[0, 1, 1, 0])
    check(tmp_path, model_of(conv, (1, 1, 4, 4), {"w": w}), (1, 1, 4, 4), exact=True)
    pad = helper.make_node("Pad", ["x", "p", "", "a"], ["y"], name="n")
    check(tmp_path, model_of(pad, (2, 3, 4), {"p": np.array([1, 0, 2, 3], np.int64),
                                              "a": np.array([-1, 0], np.int64)}, 18), (2, 3, 4),
          exact=True)
    same = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="n", strides=[2, 2],
                            auto_pad="SAME_UPPER")
    check(tmp_path, model_of(same, (1, 1, 3, 3), {"w": w}), (1, 1, 3, 3), exact=True)
