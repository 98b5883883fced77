"""Small test graphs, each drawn above its builder."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _model(nodes, name: str, x: tuple[str, list[int]], y: tuple[str, list[int]], inits,
           opset: int, ir: int) -> onnx.ModelProto:
    """One float input, one float output: the graph every builder here ends with."""
    graph = helper.make_graph(nodes, name,
                              [helper.make_tensor_value_info(x[0], TensorProto.FLOAT, x[1])],
                              [helper.make_tensor_value_info(y[0], TensorProto.FLOAT, y[1])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir,
                             producer_name="autodice-tests")


def figure2(seed: int = 0) -> onnx.ModelProto:
    """The AutoDiCE paper's Figure 2::

        input -> MaxPool1 -> Buff1 -+-> Conv1 -> Buff2 -+
                                    |                   +-> Add1 -> Buff4 -> Relu1 -> output
                                    +-> FC1   -> Buff3 -+
    """
    rng = np.random.default_rng(seed)
    w_conv = numpy_helper.from_array(rng.standard_normal((4, 4, 1, 1)).astype(np.float32), "w_conv")
    w_fc = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w_fc")
    nodes = [
        helper.make_node("MaxPool", ["input"], ["Buff1"], name="MaxPool1", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Conv", ["Buff1", "w_conv"], ["Buff2"], name="Conv1"),
        helper.make_node("MatMul", ["Buff1", "w_fc"], ["Buff3"], name="FC1"),
        helper.make_node("Add", ["Buff2", "Buff3"], ["Buff4"], name="Add1"),
        helper.make_node("Relu", ["Buff4"], ["output"], name="Relu1"),
    ]
    return _model(nodes, "figure2", ("input", [1, 4, 8, 8]), ("output", [1, 4, 4, 4]),
                  [w_conv, w_fc], opset=13, ir=8)


def wide_chain(side: int) -> onnx.ModelProto:
    """Two layers on a large tensor, for results larger than a socket holds::

        input (1x4xSIDExSIDE) -> Relu1 -> Buff1 -> Sigmoid1 -> output (1x4xSIDExSIDE)
    """
    nodes = [helper.make_node("Relu", ["input"], ["Buff1"], name="Relu1"),
             helper.make_node("Sigmoid", ["Buff1"], ["output"], name="Sigmoid1")]
    shape = [1, 4, side, side]
    return _model(nodes, "wide_chain", ("input", shape), ("output", shape), [], opset=13, ir=8)


def input_skip(seed: int = 0, side: int = 64, channels: int = 16) -> onnx.ModelProto:
    """A model input that two layers read, for a rank that forwards the input it read::

        input -+-> Conv1 -> Buff1 -+-> Add1 -> Buff2 -> Conv2 -> Buff3 -> Conv3 -> output
               +-------------------+
    """
    rng = np.random.default_rng(seed)
    w = [numpy_helper.from_array(0.1 * rng.standard_normal((channels, channels, 3, 3))
                                 .astype(np.float32), f"w{k}") for k in (1, 2, 3)]
    conv = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    nodes = [helper.make_node("Conv", ["input", "w1"], ["Buff1"], name="Conv1", **conv),
             helper.make_node("Add", ["Buff1", "input"], ["Buff2"], name="Add1"),
             helper.make_node("Conv", ["Buff2", "w2"], ["Buff3"], name="Conv2", **conv),
             helper.make_node("Conv", ["Buff3", "w3"], ["output"], name="Conv3", **conv)]
    shape = [1, channels, side, side]
    return _model(nodes, "input_skip", ("input", shape), ("output", shape), w, opset=13, ir=8)


def conv_chain(convs: int, channels: int = 64, side: int = 96,
               seed: int = 0) -> onnx.ModelProto:
    """``convs`` 3x3 convolutions in a row, Conv1 ... ConvN: stages of a known, real cost::

        input -> Conv1 -> Buff1 -> Conv2 -> ... -> ConvN -> output
    """
    rng = np.random.default_rng(seed)
    w = [numpy_helper.from_array(0.05 * rng.standard_normal((channels, channels, 3, 3))
                                 .astype(np.float32), f"w{k}") for k in range(1, convs + 1)]
    names = ["input", *(f"Buff{k}" for k in range(1, convs)), "output"]
    nodes = [helper.make_node("Conv", [names[k - 1], f"w{k}"], [names[k]], name=f"Conv{k}",
                              kernel_shape=[3, 3], pads=[1, 1, 1, 1]) for k in range(1, convs + 1)]
    shape = [1, channels, side, side]
    return _model(nodes, "conv_chain", ("input", shape), ("output", shape), w, opset=13, ir=8)


def symbolic_model() -> onnx.ModelProto:
    """Two Relus on a 1x4xHxW input: shapes only with --input-shape."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, "H", "W"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu1"),
             helper.make_node("Relu", ["r"], ["y"], name="relu2")]
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y]), ir_version=8,
                             opset_imports=[helper.make_opsetid("", 13)])


class _Builder:
    """Nodes and seeded initializers, named the way torch's dynamo exporter names them."""

    def __init__(self, seed: int):
        self.rng, self.nodes, self.inits, self.count = np.random.default_rng(seed), [], [], 0

    def weight(self, name: str, shape, scale: float = 0.2, offset: float = 0.0) -> str:
        value = offset + scale * self.rng.standard_normal(shape)
        self.inits.append(numpy_helper.from_array(value.astype(np.float32), name))
        return name

    def const(self, value, dtype=np.float32) -> str:
        self.count += 1
        name = f"val_{self.count}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def op(self, op: str, inputs: list[str], output: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], name=f"node_{output}", **attrs))
        return output


def convnext_dynamo(seed: int = 0) -> onnx.ModelProto:
    """A small ConvNeXt spelled as ``torch.onnx.export(..., dynamo=True)`` (opset 18) spells it::

        input 1x3x32x32 -> Conv 4x4/4 -> block(16) -> channel LN -> Conv 2x2/2 -> block(32) -> head

        block(C): x -> Conv dw 7x7 -> Transpose NHWC -> LayerNormalization(axis -1)
                    -> MatMul C->4C -> Add -> GELU: x*(0.5*(Erf(x/sqrt2)+1)) -> MatMul 4C->C -> Add
                    -> Transpose NCHW -> Mul gamma[C,1,1] -> Add x (residual)
        channel LN (facebook's channels_first LayerNorm):
                    ReduceMean(axes input [1]) -> Sub -> Pow 2 -> ReduceMean -> Add eps -> Sqrt
                    -> Div -> Mul w[C,1,1] -> Add b[C,1,1]
        head:       ReduceMean(axes input [-1,-2]) -> Reshape [-1] -> Gather(arange(32) as
                    [1,32,1,1]) (torchvision's as_strided) -> Transpose -> LayerNormalization
                    -> Transpose -> Reshape [1,32] -> Gemm -> logits 1x10
    """
    b = _Builder(seed)
    x = b.op("Conv", ["input", b.weight("stem.weight", (16, 3, 4, 4)), b.weight("stem.bias", 16)],
             "conv2d", kernel_shape=[4, 4], strides=[4, 4])
    sqrt2, one, half = b.const(np.sqrt(2.0)), b.const(1.0), b.const(0.5)

    def block(x: str, p: str, c: int) -> str:
        y = b.op("Conv", [x, b.weight(f"{p}.dwconv.weight", (c, 1, 7, 7)),
                          b.weight(f"{p}.dwconv.bias", c)], f"{p}_dw", group=c,
                 kernel_shape=[7, 7], pads=[3, 3, 3, 3])
        y = b.op("Transpose", [y], f"{p}_permute", perm=[0, 2, 3, 1])
        y = b.op("LayerNormalization", [y, b.weight(f"{p}.norm.weight", c, 0.1, 1.0),
                                        b.weight(f"{p}.norm.bias", c)], f"{p}_layer_norm",
                 axis=-1, epsilon=1e-6, stash_type=1)
        y = b.op("MatMul", [y, b.weight(f"{p}.pw1.weight", (c, 4 * c))], f"{p}_mm1")
        h = b.op("Add", [y, b.weight(f"{p}.pw1.bias", 4 * c)], f"{p}_linear")
        g = b.op("Div", [h, sqrt2], f"{p}_div")
        g = b.op("Erf", [g], f"{p}_erf")
        g = b.op("Add", [g, one], f"{p}_erf1")
        g = b.op("Mul", [half, g], f"{p}_half")
        g = b.op("Mul", [h, g], f"{p}_gelu")
        y = b.op("MatMul", [g, b.weight(f"{p}.pw2.weight", (4 * c, c))], f"{p}_mm2")
        y = b.op("Add", [y, b.weight(f"{p}.pw2.bias", c)], f"{p}_linear_1")
        y = b.op("Transpose", [y], f"{p}_permute_1", perm=[0, 3, 1, 2])
        y = b.op("Mul", [b.weight(f"{p}.gamma", (c, 1, 1), 0.5, 1.0), y], f"{p}_mul")
        return b.op("Add", [x, y], f"{p}_add")

    x = block(x, "stage1", 16)
    axis1, two, eps = b.const([1], np.int64), b.const(2.0), b.const(1e-6)
    mean = b.op("ReduceMean", [x, axis1], "mean", keepdims=1)
    sub = b.op("Sub", [x, mean], "sub")
    var = b.op("ReduceMean", [b.op("Pow", [sub, two], "pow"), axis1], "mean_1", keepdims=1)
    std = b.op("Sqrt", [b.op("Add", [var, eps], "add_eps")], "sqrt")
    y = b.op("Mul", [b.weight("down.0.weight", (16, 1, 1), 0.1, 1.0),
                     b.op("Div", [sub, std], "div")], "mul_ln")
    y = b.op("Add", [y, b.weight("down.0.bias", (16, 1, 1))], "add_ln")
    x = b.op("Conv", [y, b.weight("down.1.weight", (32, 16, 2, 2)), b.weight("down.1.bias", 32)],
             "conv2d_down", kernel_shape=[2, 2], strides=[2, 2])
    x = block(x, "stage2", 32)
    y = b.op("ReduceMean", [x, b.const([-1, -2], np.int64)], "mean_2", keepdims=1)
    y = b.op("Reshape", [y, b.const([-1], np.int64)], "flat")
    y = b.op("Gather", [y, b.const(np.arange(32).reshape(1, 32, 1, 1), np.int64)], "as_strided",
             axis=0)
    y = b.op("Transpose", [y], "permute_head", perm=[0, 2, 3, 1])
    y = b.op("LayerNormalization", [y, b.weight("head.norm.weight", 32, 0.1, 1.0),
                                    b.weight("head.norm.bias", 32)], "layer_norm_head",
             axis=-1, epsilon=1e-6, stash_type=1)
    y = b.op("Transpose", [y], "permute_head_1", perm=[0, 3, 1, 2])
    y = b.op("Reshape", [y, b.const([1, 32], np.int64)], "view", allowzero=1)
    b.op("Gemm", [y, b.weight("fc.weight", (10, 32)), b.weight("fc.bias", 10)], "logits",
         transB=1)
    return _model(b.nodes, "convnext_dynamo", ("input", [1, 3, 32, 32]), ("logits", [1, 10]),
                  b.inits, opset=18, ir=10)


def channel_shuffle(seed: int = 0) -> onnx.ModelProto:
    """ShuffleNet's channel shuffle between two 1x1 convolutions: its two middle tensors are
    5-D::

        input 1x8x6x6 -> Conv conv1 -> Reshape to_groups (1x2x4x6x6) -> Transpose swap
                      (1x4x2x6x6) -> Reshape back (1x8x6x6) -> Conv conv2 -> output
    """
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8, 1, 1)).astype(np.float32), w)
             for w in ("w1", "w2")]
    inits += [numpy_helper.from_array(np.array(s, np.int64), n)
              for n, s in (("groups", [1, 2, 4, 6, 6]), ("flat", [1, 8, 6, 6]))]
    nodes = [
        helper.make_node("Conv", ["input", "w1"], ["c1"], name="conv1"),
        helper.make_node("Reshape", ["c1", "groups"], ["g"], name="to_groups"),
        helper.make_node("Transpose", ["g"], ["t"], name="swap", perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["t", "flat"], ["s"], name="back"),
        helper.make_node("Conv", ["s", "w2"], ["output"], name="conv2"),
    ]
    return _model(nodes, "channel_shuffle", ("input", [1, 8, 6, 6]), ("output", [1, 8, 6, 6]),
                  inits, opset=17, ir=8)


def window_attention(seed: int = 0) -> onnx.ModelProto:
    """Swin's shifted-window attention and MaxViT's einsums, small, as torch exports them:
    the window partition and merge go through 6-D tensors, the heads through 5-D ones::

        input 1x4x8x8 -> Conv conv1 -> Transpose nhwc (1x8x8x4) -> Reshape partition
          (1x2x4x2x4x4) -> Transpose windows (1x2x2x4x4x4) -> Reshape tokens (4x16x4)
          -> MatMul qkv (4x16x12) -> Reshape heads (4x16x3x2x2) -> Transpose split
          (3x4x2x16x2) -> Gather q / k / v (4x2x16x2 each) -> Reshape q5 / k5 (1x4x2x16x2)
          -> Einsum scores (1x4x2x16x16) -> Add masked (+ 1x4x1x16x16) -> Softmax attend
          -> Reshape probs (4x2x16x16) -> MatMul mix with v (4x2x16x2) -> Transpose
          gather_heads (4x16x2x2) -> Reshape merge_heads (1x2x2x4x4x4) -> Transpose unwindow
          (1x2x4x2x4x4) -> Reshape image (1x8x8x4) -> Transpose nchw -> Conv conv2 -> output
    """
    rng = np.random.default_rng(seed)
    floats = {"w1": rng.standard_normal((4, 4, 1, 1)), "w2": rng.standard_normal((4, 4, 1, 1)),
              "wqkv": rng.standard_normal((4, 12)),
              "mask": np.where(rng.random((1, 4, 1, 16, 16)) < 0.3, -100.0, 0.0)}
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in floats.items()]
    shapes = {"s_part": [1, 2, 4, 2, 4, 4], "s_tokens": [4, 16, 4], "s_heads": [4, 16, 3, 2, 2],
              "s_5d": [1, 4, 2, 16, 2], "s_probs": [4, 2, 16, 16],
              "s_merge": [1, 2, 2, 4, 4, 4], "s_image": [1, 8, 8, 4]}
    inits += [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in shapes.items()]
    inits += [numpy_helper.from_array(np.array(i, np.int64), f"i{i}") for i in range(3)]
    node = helper.make_node
    nodes = [
        node("Conv", ["input", "w1"], ["c1"], name="conv1"),
        node("Transpose", ["c1"], ["nhwc"], name="nhwc", perm=[0, 2, 3, 1]),
        node("Reshape", ["nhwc", "s_part"], ["part"], name="partition"),
        node("Transpose", ["part"], ["win"], name="windows", perm=[0, 1, 3, 2, 4, 5]),
        node("Reshape", ["win", "s_tokens"], ["tok"], name="tokens"),
        node("MatMul", ["tok", "wqkv"], ["qkv"], name="qkv"),
        node("Reshape", ["qkv", "s_heads"], ["heads"], name="heads"),
        node("Transpose", ["heads"], ["split"], name="split", perm=[2, 0, 3, 1, 4]),
        *[node("Gather", ["split", f"i{i}"], [v], name=v, axis=0)
          for i, v in enumerate(("q", "k", "v"))],
        node("Reshape", ["q", "s_5d"], ["q5"], name="q5"),
        node("Reshape", ["k", "s_5d"], ["k5"], name="k5"),
        node("Einsum", ["q5", "k5"], ["scores"], name="scores",
             equation="b g h i d, b g h j d -> b g h i j"),
        node("Add", ["scores", "mask"], ["masked"], name="masked"),
        node("Softmax", ["masked"], ["att"], name="attend", axis=-1),
        node("Reshape", ["att", "s_probs"], ["probs"], name="probs"),
        node("MatMul", ["probs", "v"], ["mixed"], name="mix"),
        node("Transpose", ["mixed"], ["gathered"], name="gather_heads", perm=[0, 2, 1, 3]),
        node("Reshape", ["gathered", "s_merge"], ["merged"], name="merge_heads"),
        node("Transpose", ["merged"], ["unwin"], name="unwindow", perm=[0, 1, 3, 2, 4, 5]),
        node("Reshape", ["unwin", "s_image"], ["img"], name="image"),
        node("Transpose", ["img"], ["nchw"], name="nchw", perm=[0, 3, 1, 2]),
        node("Conv", ["nchw", "w2"], ["output"], name="conv2"),
    ]
    return _model(nodes, "window_attention", ("input", [1, 4, 8, 8]), ("output", [1, 4, 8, 8]),
                  inits, opset=17, ir=8)


def past_fp16(seed: int = 0) -> onnx.ModelProto:
    """Three 3x3 convolutions whose values grow past fp16's 65504 (Buff3 reaches ~2e5), then
    one that scales them back to tens::

        input (1x16x16x16) -> Conv1 -> Buff1 -> Conv2 -> Buff2 -> Conv3 -> Buff3 -> Conv4 -> output
    """
    rng = np.random.default_rng(seed)
    scales = {1: 1.0, 2: 30.0, 3: 1.0, 4: 1e-4}
    w = [numpy_helper.from_array((s * rng.standard_normal((16, 16, 3, 3))).astype(np.float32),
                                 f"w{k}") for k, s in scales.items()]
    names = ["input", "Buff1", "Buff2", "Buff3", "output"]
    nodes = [helper.make_node("Conv", [names[k - 1], f"w{k}"], [names[k]], name=f"Conv{k}",
                              kernel_shape=[3, 3], pads=[1, 1, 1, 1]) for k in scales]
    shape = [1, 16, 16, 16]
    return _model(nodes, "past_fp16", ("input", shape), ("output", shape), w, opset=13, ir=8)


class _Nodes:
    """A graph's nodes and initializers as a builder adds them: each node named after its one
    output, convolutions with seeded weights (drawn in the order they are added)."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits = [], []

    def const(self, name, a):
        self.inits.append(numpy_helper.from_array(np.asarray(a), name))
        return name

    def op(self, op_type, inputs, out, **attrs):
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def conv(self, x, cin, cout, k, s, name, act: str | None = "silu"):
        """A k x k convolution with stride s, then ``act``: "silu" (x * sigmoid(x)), another
        operator's name, or None."""
        w = self.rng.standard_normal((cout, cin, k, k)) * (1.5 / np.sqrt(cin * k * k))
        b = self.rng.standard_normal(cout) * 0.1
        y = self.op("Conv", [x, self.const(f"{name}.w", w.astype(np.float32)),
                             self.const(f"{name}.b", b.astype(np.float32))],
                    f"{name}.conv" if act else name, kernel_shape=[k, k], strides=[s, s],
                    pads=[k // 2] * 4)
        if act == "silu":
            return self.op("Mul", [y, self.op("Sigmoid", [y], f"{name}.sig")], name)
        return self.op(act, [y], name) if act else y


#   images -> b0 .. b3 (/8) -> b4 (/16) -> b5 (/32)       backbone, SiLU as x * sigmoid(x)
#   b5 -up-> cat4(b4) -> n4 -up-> cat3(b3) -> n3           neck: Resize nearest, Concat
#   n3, n4, b5 -> h0, h1, h2 -> (1, 64 + classes, h*w)    a head per scale, flattened
#   cat (axis 2) -> Split -> box: DFL (softmax over 16 bins, Conv of 0..15) -> anchors, strides
#                         -> cls: Sigmoid;   output0 = Concat(xywh, scores): (1, 4 + classes, n)
def yolo_like(seed: int = 0, side: int = 64, classes: int = 8, masks: int = 0) -> onnx.ModelProto:
    """A detector in Ultralytics' layout (YOLOv8's head, decoded in the graph), small enough to
    split, build and run in seconds: what CI covers of detectors without torch. With ``masks``,
    a segmenter's as YOLOv8-seg's: ``masks`` coefficients per candidate after the scores
    (a 1x1 head on each scale), and a second output "output1", the prototype masks at 1/4 of
    the input (from the stride-8 neck: upsampled, then two convolutions)."""
    g = _Nodes(seed)
    const, op = g.const, g.op

    def conv(x, cin, cout, k, s, name, silu=True):
        return g.conv(x, cin, cout, k, s, name, "silu" if silu else None)

    b2 = conv(conv(conv("images", 3, 16, 3, 2, "b0"), 16, 32, 3, 2, "b1"), 32, 32, 3, 1, "b2")
    b3 = conv(b2, 32, 32, 3, 2, "b3")
    b4 = conv(b3, 32, 48, 3, 2, "b4")
    b5 = conv(b4, 48, 64, 3, 2, "b5")
    up = const("up.scales", np.array([1, 1, 2, 2], np.float32))
    n4 = conv(op("Concat", [op("Resize", [b5, "", up], "up5", mode="nearest"), b4], "cat4",
                 axis=1), 112, 48, 3, 1, "n4")
    n3 = conv(op("Concat", [op("Resize", [n4, "", up], "up4", mode="nearest"), b3], "cat3",
                 axis=1), 80, 32, 3, 1, "n3")
    no, flats, anchors, strides = 64 + classes, [], [], []
    for i, (feat, c, stride) in enumerate([(n3, 32, 8), (n4, 48, 16), (b5, 64, 32)]):
        h = side // stride
        head = conv(conv(feat, c, 32, 3, 1, f"h{i}a"), 32, no, 1, 1, f"h{i}", silu=False)
        flats.append(op("Reshape", [head, const(f"h{i}.shape", np.array([1, no, h * h]))],
                        f"h{i}.flat"))
        gy, gx = np.meshgrid(np.arange(h) + 0.5, np.arange(h) + 0.5, indexing="ij")
        anchors.append(np.stack([gx.ravel(), gy.ravel()]))
        strides.append(np.full(h * h, stride))
    n = sum(a.shape[1] for a in anchors)
    g.nodes.append(helper.make_node("Split", [op("Concat", flats, "cat", axis=2),
                                            const("split.sizes", np.array([64, classes]))],
                                  ["box", "cls"], name="split", axis=1))
    bins = op("Transpose", [op("Reshape", ["box", const("dfl.shape", np.array([1, 4, 16, n]))],
                               "dfl.r")], "dfl.t", perm=[0, 2, 1, 3])
    weights = const("dfl.w", np.arange(16, dtype=np.float32).reshape(1, 16, 1, 1))
    dist = op("Reshape", [op("Conv", [op("Softmax", [bins], "dfl.s", axis=1), weights], "dfl.c",
                             kernel_shape=[1, 1]), const("dfl.out", np.array([1, 4, n]))], "dist")
    g.nodes.append(helper.make_node("Split", [dist, const("lt.sizes", np.array([2, 2]))],
                                  ["lt", "rb"], name="lt_rb", axis=1))
    anchor = const("anchors", np.concatenate(anchors, 1)[None].astype(np.float32))
    x1y1, x2y2 = op("Sub", [anchor, "lt"], "x1y1"), op("Add", [anchor, "rb"], "x2y2")
    cxy = op("Mul", [op("Add", [x1y1, x2y2], "c2"), const("half", np.array(0.5, np.float32))],
             "cxy")
    xywh = op("Concat", [cxy, op("Sub", [x2y2, x1y1], "wh")], "xywh", axis=1)
    boxes = op("Mul", [xywh, const("strides", np.concatenate(strides)[None, None].astype(
        np.float32))], "boxes")
    parts = [boxes, op("Sigmoid", ["cls"], "scores")]
    if masks:
        parts.append(op("Concat", [
            op("Reshape", [g.conv(feat, c, masks, 1, 1, f"m{i}", None),
                           const(f"m{i}.shape", np.array([1, masks, (side // s) ** 2]))],
               f"m{i}.flat")
            for i, (feat, c, s) in enumerate([(n3, 32, 8), (n4, 48, 16), (b5, 64, 32)])],
            "coefs", axis=2))
        big = op("Resize", [conv(n3, 32, 32, 3, 1, "p0"), "", up], "p.up", mode="nearest")
        g.conv(conv(big, 32, 32, 3, 1, "p1"), 32, masks, 1, 1, "output1", None)
    op("Concat", parts, "output0", axis=1)
    model = _model(g.nodes, "yolo_like", ("images", [1, 3, side, side]),
                   ("output0", [1, 4 + classes + masks, n]), g.inits, 17, 8)
    if masks:
        model.graph.output.append(helper.make_tensor_value_info(
            "output1", TensorProto.FLOAT, [1, masks, side // 4, side // 4]))
    return model


def lraspp_like(seed: int = 0, side: int = 64, classes: int = 4) -> onnx.ModelProto:
    """A segmenter in LRASPP's shape (torchvision's LRASPP-MobileNetV3 head): a backbone with a
    low-level tap, a high branch gated by a global-average-pooled sigmoid, both classified and
    added at the low level's size, then upsampled to the input: (1, classes, side, side)
    scores. What CI covers of segmenters without torch."""
    g = _Nodes(seed)
    const, op = g.const, g.op

    def conv(x, cin, cout, k, s, name, act="Relu"):
        return g.conv(x, cin, cout, k, s, name, act)

    low = conv(conv("image", 3, 16, 3, 2, "s0"), 16, 24, 3, 2, "s1")  # 1/4
    high = conv(conv(low, 24, 32, 3, 2, "s2"), 32, 48, 3, 2, "s3")  # 1/16
    cbr = conv(high, 48, 32, 1, 1, "cbr")
    gate = conv(op("GlobalAveragePool", [high], "pool"), 48, 32, 1, 1, "scale", act="Sigmoid")
    gated = op("Mul", [cbr, gate], "gated")
    up = op("Resize", [gated, "", const("up.scales", np.array([1, 1, 4, 4], np.float32))],
            "up", mode="linear")
    scores = op("Add", [conv(low, 24, classes, 1, 1, "low_cls", act=None),
                        conv(up, 32, classes, 1, 1, "high_cls", act=None)], "scores")
    op("Resize", [scores, "", const("out.scales", np.array([1, 1, 4, 4], np.float32))], "out",
       mode="linear")
    return _model(g.nodes, "lraspp_like", ("image", [1, 3, side, side]),
                  ("out", [1, classes, side, side]), g.inits, 17, 8)
