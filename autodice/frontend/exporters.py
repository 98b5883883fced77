"""What exporters write and pnnx refuses or mis-converts, spelled in ops it converts right.

Found by running ONNX's own conformance tests (``tests/test_conformance.py``) through split, gen,
build and run: each rule keeps the function exactly (``tests/test_exporter_rules.py`` holds
every one to onnxruntime over random shapes), and gen's check of each conversion still has the
last word.

* ``auto_pad`` SAME_UPPER / SAME_LOWER / VALID (Conv, ConvTranspose, pools): the pads spelled
  out, as the ONNX spec computes them; ConvTranspose's ``output_shape`` likewise.
* Gemm on more than one row (pnnx writes an ``F.linear`` ncnn cannot load): MatMul, with the
  transposes, ``alpha`` and ``beta`` as ops of their own.
* MaxPool and AveragePool with dilations, or in ceil mode where ONNX drops the last window
  because it would start on the padding (ncnn's pooling has no dilation and keeps that window),
  and MaxPool with asymmetric pads:
  one grouped convolution gathers every window's elements (one-hot kernels, each element times
  1), a max pool over them takes the largest; an average is a convolution of ones divided by each
  window's count.
* PRelu with a slope that is not one per channel (broadcast on the last axis, or a full
  tensor): ``Relu(x) - slope * Relu(-x)``.
* LayerNormalization over several axes, or on a tensor whose leading axis is no batch of one:
  its mean and variance by ReduceMean.
* BatchNormalization on a tensor whose leading axis is no batch of one (LeViT normalizes its
  tokens flattened to 196x256; ncnn's BatchNorm scales a 2-D Mat by rows, so every token got
  the wrong channel's statistics): one multiply and one add per channel.
* ReduceSum over constant axes given as an input (opset 13 on; MobileViT-v2's attention): pnnx
  reads one axis there as no axis and sums nothing. A ReduceMean, whose axes stay an attribute
  up to opset 17, times the count.
* ReduceL2 over other axes than the channels of a 4-D tensor: the square root of a
  ReduceSumSquare. pnnx fuses ``x / max(ReduceL2(x), eps)``, ``F.normalize``, into an ncnn
  Normalize over channels whatever the axis (EdgeNeXt's attention normalizes over its tokens).
* InstanceNormalization of a 3-D tensor (torch's GroupNorm, MobileViT-v2's: pnnx writes an
  InstanceNorm1d ncnn does not have): the same on a 4-D view, N x C x L x 1.
* DepthToSpace and SpaceToDepth, both modes: the Reshape, Transpose, Reshape the spec defines
  (six axes, which the lowering to four then takes).
* Selu with its own ``alpha`` and ``gamma``: ``gamma * Elu(x, alpha)``.
* Transpose without ``perm``: the reversed axes, written out.
* Max, Min, Sum, Mean of one input or more than two: Identity, or a chain of pairs.
* Split: a Slice per output. Tile by constant repeats: Concat of copies. Dropout outside
  training: its input. ConvTranspose with pads unequal at an axis's two ends: unpadded, then
  cropped. Pad with ``axes``: the pads of every axis.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..core.model import Graph
from ..core.onnxio import read_array
from .nodes import Nodes, Rewrite, attr, ints, shape_of, with_attrs
from .pooling import pool_by_convolution

# ---- auto_pad and output_shape ---------------------------------------------------------------

# (MaxPool's auto_pad pnnx spells itself; its explicit asymmetric pads it does not:
# pool_by_convolution takes those.)
PADDED = frozenset({"Conv", "ConvTranspose", "AveragePool", "LpPool"})


def explicit_pads(graph: Graph, node: onnx.NodeProto) -> onnx.NodeProto | None:
    """``node`` with its ``auto_pad`` (or ConvTranspose's ``output_shape``) spelled as pads, or
    None when it has neither or a shape it needs is not static."""
    mode = attr(node, "auto_pad", "NOTSET")
    given_out = attr(node, "output_shape") if node.op_type == "ConvTranspose" else None
    if node.op_type not in PADDED or (mode == "NOTSET" and not given_out):
        return None
    x, y = shape_of(graph, node.input[0]), shape_of(graph, node.output[0])
    if x is None or y is None:
        return None
    spatial = len(x) - 2
    if node.op_type in ("Conv", "ConvTranspose"):
        w = shape_of(graph, node.input[1])
        if w is None:
            return None
        kernel = list(w[2:])
    else:
        kernel = list(attr(node, "kernel_shape"))
    strides = list(attr(node, "strides", [1] * spatial))
    dilations = list(attr(node, "dilations", [1] * spatial))
    begin, end, extra = [], [], []
    for i in range(spatial):
        span = (kernel[i] - 1) * dilations[i] + 1
        if node.op_type == "ConvTranspose":
            out_pad = list(attr(node, "output_padding", [0] * spatial))[i]
            total = strides[i] * (x[2 + i] - 1) + out_pad + span - y[2 + i]
            if total < 0:  # output_shape past what pads allow: the rest is output padding
                extra.append(out_pad - total)
                total = 0
            else:
                extra.append(out_pad)
        else:
            total = max(0, (y[2 + i] - 1) * strides[i] + span - x[2 + i]) if mode != "VALID" \
                else 0
        first = total // 2 if mode == "SAME_UPPER" else total - total // 2
        begin.append(first)
        end.append(total - first)
    attrs = {"pads": begin + end}
    if node.op_type == "ConvTranspose":
        attrs["output_padding"] = extra
    return with_attrs(node, ("auto_pad", "output_shape"), **attrs)


# ---- Gemm ------------------------------------------------------------------------------------


def gemm_as_matmul(graph: Graph, node: onnx.NodeProto, opset: int) -> Rewrite:
    """Y = alpha * A' B' + beta * C as MatMul, Mul and Add, when A' has more than one row."""
    a = shape_of(graph, node.input[0])
    trans_a, trans_b = attr(node, "transA", 0), attr(node, "transB", 0)
    if a is None or len(a) != 2 or (a[1] if trans_a else a[0]) == 1:
        return None
    alpha, beta = float(attr(node, "alpha", 1.0)), float(attr(node, "beta", 1.0))
    n = Nodes(node)
    left = n.op("Transpose", [node.input[0]], "a_t", perm=[1, 0]) if trans_a else node.input[0]
    right = n.op("Transpose", [node.input[1]], "b_t", perm=[1, 0]) if trans_b else node.input[1]
    has_c = len(node.input) > 2 and node.input[2] != ""
    last = not has_c and alpha == 1.0
    y = n.op("MatMul", [left, right], "matmul", out=node.output[0] if last else None)
    if alpha != 1.0:
        y = n.op("Mul", [y, n.const("alpha", np.array(alpha, np.float32))], "alpha",
                 out=node.output[0] if not has_c else None)
    if has_c:
        c = node.input[2]
        if beta != 1.0:
            c = n.op("Mul", [c, n.const("beta", np.array(beta, np.float32))], "beta")
        n.op("Add", [y, c], "bias", out=node.output[0])
    return n.nodes


# ---- element-wise and layout ops ------------------------------------------------------------


def prelu_any_slope(graph: Graph, node: onnx.NodeProto, opset: int) -> Rewrite:
    """PRelu whose slope is not one per channel: Relu(x) - slope * Relu(-x), the same values."""
    x, s = shape_of(graph, node.input[0]), shape_of(graph, node.input[1])
    if x is None or s is None or math.prod(s) == 1:
        return None
    channel = len(x) >= 3 and x[0] == 1 and math.prod(s) == x[1] and (
        s in ((x[1],) + (1,) * (len(x) - 2), (1, x[1]) + (1,) * (len(x) - 2)))
    if channel:
        return None
    n = Nodes(node)
    pos = n.op("Relu", [node.input[0]], "pos")
    neg = n.op("Relu", [n.op("Neg", [node.input[0]], "minus")], "neg")
    n.op("Sub", [pos, n.op("Mul", [node.input[1], neg], "scaled")], out=node.output[0])
    return n.nodes


def layer_norm_by_reductions(graph: Graph, node: onnx.NodeProto, opset: int) -> Rewrite:
    """LayerNormalization over several axes, or of a tensor whose leading axis is not a batch
    of one, as (x - mean) / sqrt(var + eps) * scale + bias."""
    x = shape_of(graph, node.input[0])
    if x is None:
        return None
    outputs = list(node.output) + ["", ""]
    axis = attr(node, "axis", -1) % len(x)
    if x[0] == 1 and axis == len(x) - 1 and not any(outputs[1:3]):
        return None  # ViTs' own: pnnx converts it to ncnn's LayerNorm
    axes = list(range(axis, len(x)))
    eps = float(attr(node, "epsilon", 1e-5))
    n = Nodes(node)

    def mean(t: str, suffix: str) -> str:
        if opset >= 18:
            return n.op("ReduceMean", [t, n.const(f"{suffix}_axes", ints(axes))], suffix,
                        keepdims=1)
        return n.op("ReduceMean", [t], suffix, axes=axes, keepdims=1)

    mu = mean(node.input[0], "mean")
    dev = n.op("Sub", [node.input[0], mu], "dev")
    var = mean(n.op("Mul", [dev, dev], "sq"), "var")
    std = n.op("Sqrt", [n.op("Add", [var, n.const("eps", np.array(eps, np.float32))], "vareps")],
               "std")
    if outputs[1]:  # the optional Mean and InvStdDev outputs
        n.op("Identity", [mu], "mean_out", out=outputs[1])
    if outputs[2]:
        n.op("Reciprocal", [std], "inv_std", out=outputs[2])
    normed = n.op("Div", [dev, std], "normed")
    has_bias = len(node.input) > 2 and node.input[2] != ""
    scaled = n.op("Mul", [normed, node.input[1]], "scaled",
                  out=None if has_bias else node.output[0])
    if has_bias:
        n.op("Add", [scaled, node.input[2]], out=node.output[0])
    return n.nodes


def batch_norm_off_batch(graph: Graph, node: onnx.NodeProto, opset: int) -> Rewrite:
    """BatchNormalization at inference of a tensor whose axis 0 is not a batch of one, as
    ``x * scale + shift`` with scale = gamma / sqrt(var + eps) and shift = beta - mean * scale,
    per channel (axis 1). Needs the four statistics as weights; training mode is left alone."""
    x = shape_of(graph, node.input[0])
    if (x is None or len(x) < 2 or x[0] == 1 or attr(node, "training_mode", 0)
            or len(node.output) > 1 or not all(graph.is_weight(t) for t in node.input[1:5])):
        return None
    gamma, beta, mean, var = (read_array(graph.tensors[t]).astype(np.float64)
                              for t in node.input[1:5])
    scale = gamma / np.sqrt(var + float(attr(node, "epsilon", 1e-5)))
    per_channel = (x[1],) + (1,) * (len(x) - 2)
    n = Nodes(node)
    scaled = n.op("Mul", [node.input[0], n.const(
        "scale", scale.astype(np.float32).reshape(per_channel))], "scaled")
    n.op("Add", [scaled, n.const("shift", (beta - mean * scale).astype(np.float32)
                                 .reshape(per_channel))], out=node.output[0])
    return n.nodes


def reduce_sum_by_mean(graph: Graph, node: onnx.NodeProto, opset: int) -> Rewrite:
    """ReduceSum(x, constant axes) at opset 13 or later as ReduceMean over those axes times the
    number of elements each output sums."""
    x = shape_of(graph, node.input[0])
    axes = _value(graph, node.input[1]) if opset >= 13 and len(node.input) > 1 else None
    floats = "float" in graph.types[node.input[0]].dtype
    if x is None or axes is None or axes.size == 0 or not floats:
        return None  # (integer sums are shape plumbing, which the followers pass folds)
    axes = sorted(int(a) % len(x) for a in axes.ravel())
    n = Nodes(node)
    keep = {"keepdims": attr(node, "keepdims", 1)}
    if opset >= 18:  # (legalize's reduce_axes_as_attributes moves them back where it can)
        mean = n.op("ReduceMean", [node.input[0], n.const("axes", ints(axes))], "mean", **keep)
    else:
        mean = n.op("ReduceMean", [node.input[0]], "mean", axes=axes, **keep)
    count = math.prod(x[a] for a in axes)
    n.op("Mul", [mean, n.const("count", np.array(count, np.float32))], out=node.output[0])
    return n.nodes


def l2_by_squares(graph: Graph, node: onnx.NodeProto, opset: int) -> Rewrite:
    """ReduceL2 as the square root of a ReduceSumSquare over the same axes, unless it reduces
    the channels of a 4-D tensor alone.

    pnnx fuses x / max(ReduceL2(x), eps), as exporters write ``F.normalize(x, dim)``, into one
    ncnn Normalize layer, which normalizes over channels whatever ``dim`` was, and is wrong even
    over the channels of a 1x512 embedding or of 1x12x64 tokens. EdgeNeXt's cross-covariance
    attention normalizes its queries and keys over the tokens: 2x their scale off (whole, its
    layer scale of 1e-6 hid it). A square root of a sum of squares is not that pattern."""
    x = shape_of(graph, node.input[0])
    axes = attr(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        axes = _value(graph, node.input[1])
        axes = None if axes is None else [int(a) for a in axes.ravel()]
    if x is not None and len(x) == 4 and axes is not None and [a % 4 for a in axes] == [1]:
        return None
    n = Nodes(node)
    squares = n.op("ReduceSumSquare", list(node.input), "squares",
                   **{a.name: helper.get_attribute_value(a) for a in node.attribute})
    n.op("Sqrt", [squares], out=node.output[0])
    return n.nodes


def instance_norm_in_4d(graph: Graph, node: onnx.NodeProto, opset: int) -> Rewrite:
    """InstanceNormalization of N x C x L as the same op on N x C x L x 1, reshaped back."""
    x = shape_of(graph, node.input[0])
    if x is None or len(x) != 3:
        return None
    n = Nodes(node)
    view = n.op("Reshape", [node.input[0], n.const("shape4d", ints([*x, 1]))], "4d")
    normed = n.op(node.op_type, [view, *node.input[1:]], "normed",
                  **{a.name: helper.get_attribute_value(a) for a in node.attribute})
    n.op("Reshape", [normed, n.const("shape", ints(x))], out=node.output[0])
    return n.nodes


def depth_space_by_transpose(graph: Graph, node: onnx.NodeProto, opset: int) -> Rewrite:
    """DepthToSpace and SpaceToDepth as the spec defines them: Reshape, Transpose, Reshape."""
    x, y = shape_of(graph, node.input[0]), shape_of(graph, node.output[0])
    if x is None or y is None or len(x) != 4:
        return None
    b, crd = attr(node, "blocksize"), attr(node, "mode", "DCR") == "CRD"
    (nb, c, h, w), n = x, Nodes(node)
    if node.op_type == "DepthToSpace":
        c2 = c // (b * b)
        six, perm = (((nb, c2, b, b, h, w), [0, 1, 4, 2, 5, 3]) if crd
                     else ((nb, b, b, c2, h, w), [0, 3, 4, 1, 5, 2]))
    else:
        six, perm = (nb, c, h // b, b, w // b, b), ([0, 1, 3, 5, 2, 4] if crd
                                                    else [0, 3, 5, 1, 2, 4])
    split = n.op("Reshape", [node.input[0], n.const("six", ints(six))], "split")
    moved = n.op("Transpose", [split], "moved", perm=perm)
    n.op("Reshape", [moved, n.const("shape", ints(y))], out=node.output[0])
    return n.nodes


def selu_as_elu(graph: Graph, node: onnx.NodeProto, opset: int) -> Rewrite:
    """Selu with its own alpha or gamma (pnnx knows only the defaults): gamma * Elu(x, alpha)."""
    alpha, gamma = attr(node, "alpha"), attr(node, "gamma")
    if alpha is None and gamma is None:
        return None
    alpha = 1.6732632423543772 if alpha is None else alpha
    gamma = 1.0507009873554805 if gamma is None else gamma
    n = Nodes(node)
    elu = n.op("Elu", [node.input[0]], "elu", alpha=float(alpha))
    n.op("Mul", [elu, n.const("gamma", np.array(gamma, np.float32))], out=node.output[0])
    return n.nodes


def transpose_perm(graph: Graph, node: onnx.NodeProto, opset: int) -> Rewrite:
    """Transpose without ``perm`` (the axes reversed), the perm written out."""
    x = shape_of(graph, node.input[0])
    if x is None or attr(node, "perm") is not None:
        return None
    return [with_attrs(node, perm=list(reversed(range(len(x)))))]


def _value(graph: Graph, tensor: str) -> np.ndarray | None:
    """The value of a small constant input (an initializer, or a folded Constant), or None."""
    if not tensor:
        return None
    proto = graph.lazy.small.get(tensor) or graph.folded().get(tensor)
    return numpy_helper.to_array(proto) if proto is not None else None


def chain_of_pairs(graph: Graph, node: onnx.NodeProto, opset: int) -> Rewrite:
    """Max, Min, Sum and Mean of one input or of more than two (pnnx takes two), as Identity or
    a chain of pairs (and Mean's division)."""
    inputs = [t for t in node.input if t]
    if len(inputs) == 2:
        return None
    n = Nodes(node)
    if len(inputs) == 1:
        n.op("Identity", inputs, out=node.output[0])
        return n.nodes
    pair = "Add" if node.op_type in ("Sum", "Mean") else node.op_type
    acc = inputs[0]
    for k, t in enumerate(inputs[1:], 1):
        last = k == len(inputs) - 1 and node.op_type != "Mean"
        acc = n.op(pair, [acc, t], f"pair{k}", out=node.output[0] if last else None)
    if node.op_type == "Mean":
        n.op("Div", [acc, n.const("count", np.array(len(inputs), np.float32))],
             out=node.output[0])
    return n.nodes


def split_as_slices(graph: Graph, node: onnx.NodeProto, opset: int) -> Rewrite:
    """Split into a Slice per output (ncnn's Slice layer, as pnnx writes it for a Split, crashed
    or cut unevenly where ONNX gives the last part the remainder)."""
    x = shape_of(graph, node.input[0])
    outs = [shape_of(graph, t) for t in node.output]
    if x is None or any(o is None for o in outs) or opset < 10:
        return None
    axis = attr(node, "axis", 0) % len(x)
    n, start = Nodes(node), 0
    for k, (t, shape) in enumerate(zip(node.output, outs)):
        end = start + shape[axis]
        if t:
            n.op("Slice", [node.input[0], n.const(f"starts{k}", ints([start])),
                           n.const(f"ends{k}", ints([end])), n.const(f"axes{k}", ints([axis]))],
                 f"part{k}", out=t)
        start = end
    return n.nodes


def tile_as_concat(graph: Graph, node: onnx.NodeProto, opset: int) -> Rewrite:
    """Tile by constant repeats (ncnn has no Tile) as Concat of copies, axis by axis."""
    x, repeats = shape_of(graph, node.input[0]), _value(graph, node.input[1])
    if x is None or repeats is None:
        return None
    n, cur = Nodes(node), node.input[0]
    todo = [(a, int(r)) for a, r in enumerate(repeats.ravel()) if int(r) != 1]
    if not todo or any(r < 1 for _, r in todo):
        return None
    for k, (axis, r) in enumerate(todo):
        cur = n.op("Concat", [cur] * r, f"tile{axis}", axis=axis,
                   out=node.output[0] if k == len(todo) - 1 else None)
    return n.nodes


def dropout_at_inference(graph: Graph, node: onnx.NodeProto, opset: int) -> Rewrite:
    """Dropout outside training, whose mask nobody takes: its input, unchanged."""
    training = _value(graph, node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if (len(node.output) > 1 and node.output[1]) or (training is not None and training.any()) \
            or (len(node.input) > 2 and node.input[2] and training is None):
        return None
    return [helper.make_node("Identity", [node.input[0]], [node.output[0]],
                             name=node.name or node.output[0])]


def conv_transpose_cropped(graph: Graph, node: onnx.NodeProto, opset: int) -> Rewrite:
    """ConvTranspose with pads that differ at the two ends of an axis (pnnx writes a layer ncnn
    does not have): unpadded, then the pads cropped off by a Slice."""
    pads = attr(node, "pads")
    y = shape_of(graph, node.output[0])
    if pads is None or y is None or pads[:len(pads) // 2] == pads[len(pads) // 2:] or opset < 10:
        return None
    half = len(pads) // 2
    n = Nodes(node)
    full = n.op("ConvTranspose", list(node.input), "full",
                **{a.name: helper.get_attribute_value(a) for a in node.attribute
                   if a.name != "pads"})
    axes = list(range(2, 2 + half))
    n.op("Slice", [full, n.const("starts", ints(pads[:half])),
                   n.const("ends", ints([pads[i] + y[2 + i] for i in range(half)])),
                   n.const("axes", ints(axes))], out=node.output[0])
    return n.nodes


def pad_every_axis(graph: Graph, node: onnx.NodeProto, opset: int) -> Rewrite:
    """Pad with ``axes`` (opset 18): the pads of every axis, the others 0 (pnnx reads those)."""
    x = shape_of(graph, node.input[0])
    pads = _value(graph, node.input[1]) if len(node.input) > 1 else None
    axes = _value(graph, node.input[3]) if len(node.input) > 3 else None
    if x is None or pads is None or axes is None:
        return None
    full = [0] * (2 * len(x))
    for i, a in enumerate(int(a) % len(x) for a in axes.ravel()):
        full[a], full[a + len(x)] = int(pads.ravel()[i]), int(pads.ravel()[i + axes.size])
    n = Nodes(node)
    inputs = [node.input[0], n.const("pads", ints(full))]
    if len(node.input) > 2 and node.input[2]:
        inputs.append(node.input[2])
    n.op("Pad", inputs, out=node.output[0],
         **{a.name: helper.get_attribute_value(a) for a in node.attribute})
    return n.nodes


def respell(graph: Graph, node: onnx.NodeProto, opset: int) -> Rewrite:
    """``node`` in ops pnnx converts right (see the module docstring), or None to keep it."""
    if node.domain not in ("", "ai.onnx"):
        return None
    padded = explicit_pads(graph, node)
    if padded is not None:
        return RULES.get(node.op_type, lambda *_: None)(graph, padded, opset) or [padded]
    rule = RULES.get(node.op_type)
    return rule(graph, node, opset) if rule else None


RULES = {"Gemm": gemm_as_matmul, "MaxPool": pool_by_convolution,
         "AveragePool": pool_by_convolution, "PRelu": prelu_any_slope,
         "LayerNormalization": layer_norm_by_reductions,
         "BatchNormalization": batch_norm_off_batch,
         "InstanceNormalization": instance_norm_in_4d, "ReduceSum": reduce_sum_by_mean,
         "ReduceL2": l2_by_squares,
         "DepthToSpace": depth_space_by_transpose,
         "SpaceToDepth": depth_space_by_transpose, "Selu": selu_as_elu,
         "Transpose": transpose_perm, "Max": chain_of_pairs, "Min": chain_of_pairs,
         "Sum": chain_of_pairs, "Mean": chain_of_pairs, "Split": split_as_slices,
         "Tile": tile_as_concat, "Dropout": dropout_at_inference,
         "ConvTranspose": conv_transpose_cropped, "Pad": pad_every_axis}
