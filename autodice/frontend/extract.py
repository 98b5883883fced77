"""Writing one ONNX sub-model per rank.

A sub-model holds the rank's layers (followers included; ``Shape`` folded to a constant because
the tensor it measures may live on another rank), the weights they read, graph inputs = model
inputs it reads + tensors it receives, graph outputs = tensors it sends + model outputs it makes.
Weights are copied from the source file by reference (see :mod:`autodice.onnxio`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..core.model import SHAPE_OPS, Graph, shape_constant
from ..core.onnxio import write_model
from ..core.plan import Plan, Rank, TensorSpec


def _value_info(graph: Graph, spec: TensorSpec) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(spec.name, graph.types[spec.name].elem_type, spec.shape)


LEGACY_SOFTMAX = ("Softmax", "LogSoftmax", "Hardmax")


def _opset(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _through_2d(graph: Graph, node: onnx.NodeProto, shape2d: list[int],
                **attrs) -> list[onnx.NodeProto]:
    """``node`` applied to its first input reshaped to ``shape2d``, the result reshaped back."""
    name, x, y = node.name or node.output[0], node.input[0], node.output[0]

    def const(suffix: str, values) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [f"{name}/{suffix}"], name=f"{name}/{suffix}",
                                value=helper.make_tensor(f"{name}/{suffix}", onnx.TensorProto.INT64,
                                                         [len(values)], values))

    return [const("shape2d", shape2d), const("shape", list(graph.types[y].shape)),
            helper.make_node("Reshape", [x, f"{name}/shape2d"], [f"{name}/2d"], name=f"{name}/2d"),
            helper.make_node(node.op_type, [f"{name}/2d", *node.input[1:]], [f"{name}/out2d"],
                             name=name, **attrs),
            helper.make_node("Reshape", [f"{name}/out2d", f"{name}/shape"], [y],
                             name=f"{name}/back")]


def _ints(node: onnx.NodeProto, name: str) -> list[int] | None:
    return next((list(a.ints) for a in node.attribute if a.name == name), None)


def _explicit_pads(graph: Graph, node: onnx.NodeProto, pads: list[int]) -> list[onnx.NodeProto]:
    """AveragePool with asymmetric pads (Inception-v1's last pool pads only bottom and right),
    which pnnx leaves as an op ncnn does not have, spelled as zero padding + unpadded
    AveragePool, times the window size over the count of real elements per window
    (count_include_pad=0) or not."""
    name, x, y = node.name or node.output[0], node.input[0], node.output[0]
    (kh, kw), (sh, sw) = _ints(node, "kernel_shape"), _ints(node, "strides") or [1, 1]
    _, _, h, w = graph.types[x].shape
    _, _, oh, ow = graph.types[y].shape
    # Zeros concatenated on each padded side: pnnx converts Concat, not opset-9 Pad.
    c, pad, cur, size = graph.types[x].shape[1], [], x, [h, w]
    for axis, before, after in ((2, pads[0], pads[2]), (3, pads[1], pads[3])):
        parts = []
        for side, n in (("before", before), ("after", after)):
            if n:
                shape = [1, c, *size]
                shape[axis] = n
                zeros = f"{name}/zeros{axis}{side}"
                pad.append(helper.make_node("Constant", [], [zeros], name=zeros,
                                            value=numpy_helper.from_array(
                                                np.zeros(shape, np.float32), zeros)))
                parts.append((side, zeros))
        if not parts:
            continue
        out = f"{name}/padded{axis}"
        pad.append(helper.make_node(
            "Concat", [z for sd, z in parts if sd == "before"] + [cur]
            + [z for sd, z in parts if sd == "after"], [out], name=out, axis=axis))
        cur, size[axis - 2] = out, size[axis - 2] + before + after
    pool = helper.make_node("AveragePool", [cur], [y], name=name,
                            kernel_shape=[kh, kw], strides=[sh, sw])
    if next((a.i for a in node.attribute if a.name == "count_include_pad"), 0):
        return [*pad, pool]
    rows = np.array([min(i * sh - pads[0] + kh, h) - max(i * sh - pads[0], 0) for i in range(oh)])
    cols = np.array([min(j * sw - pads[1] + kw, w) - max(j * sw - pads[1], 0) for j in range(ow)])
    scale = (kh * kw / np.outer(rows, cols)).astype(np.float32).reshape(1, 1, oh, ow)
    pool.output[0] = f"{name}/sum"
    return [*pad, pool,
            helper.make_node("Constant", [], [f"{name}/scale"], name=f"{name}/scale",
                             value=numpy_helper.from_array(scale, f"{name}/scale")),
            helper.make_node("Mul", [f"{name}/sum", f"{name}/scale"], [y], name=f"{name}/mean")]


def legalize(graph: Graph, node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto] | None:
    """The same function in a spelling pnnx converts correctly, or None if ``node`` is fine.

    Before opset 13, Softmax(axis=a) flattens the input to 2-D at ``a``; pnnx converts that
    wrongly for inputs of rank > 2 (SqueezeNet's 1x1000x1x1 comes out all ones). It becomes
    Reshape to 2-D, Softmax, Reshape back. AveragePool with asymmetric pads: see
    ``_explicit_pads``.
    """
    shape = graph.types[node.input[0]].shape if node.input else ()
    if node.op_type == "AveragePool" and len(shape) == 4:
        pads = list(_ints(node, "pads") or [0, 0, 0, 0])
        if pads[:2] != pads[2:]:
            return _explicit_pads(graph, node, pads)
    if node.op_type in LEGACY_SOFTMAX and opset < 13 and len(shape) > 2:
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1) % len(shape)
        rows = 1
        for d in shape[:axis]:
            rows *= d
        return _through_2d(graph, node, [rows, -1], axis=1)
    return None


# Ops from which pnnx learns that axis 0 of a 4-D tensor is the batch axis.
BATCH_OPS = frozenset({"Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool",
                       "GlobalMaxPool", "BatchNormalization", "InstanceNormalization", "LRN"})


def pin_batch(g: onnx.GraphProto, inputs: tuple[TensorSpec, ...]) -> None:
    """Put an identity 1x1 MaxPool in front of 4-D inputs that only batch-blind ops read.

    pnnx decides whether axis 0 is the batch from the ops that read a tensor. A sub-model whose
    input goes straight into Mul/Add/Concat/MatMul (a DenseNet cut inside its batch norm, spelled
    Mul + Add; Figure 2's FC1 + Add1) gets no hint, and pnnx then takes 1x64x56x56 for a 4-D
    tensor without batch: a 64-vector broadcasts along the wrong axis and the rank sends 4x the
    elements. A MaxPool tells pnnx; in ncnn it is one copy of the tensor.
    """
    for spec in inputs:
        if len(spec.shape) != 4 or spec.shape[0] != 1 or spec.dtype != "float32":
            continue
        users = [n for n in g.node if spec.name in n.input]
        if all(n.op_type in BATCH_OPS for n in users):
            continue
        pinned = f"{spec.name}/batch"
        for n in users:
            n.input[:] = [pinned if t == spec.name else t for t in n.input]
        g.node.insert(0, helper.make_node("MaxPool", [spec.name], [pinned], name=pinned,
                                          kernel_shape=[1, 1]))


def submodel_proto(graph: Graph, rank: Rank, nodes: list[int]) -> tuple[onnx.ModelProto, list]:
    """The rank's model without initializers, and the weights to append, in first-use order."""
    src = graph.lazy.proto
    model = onnx.ModelProto()
    model.ir_version = max(src.ir_version, 4)  # IR 4+ lets initializers stay out of the inputs
    model.opset_import.extend(src.opset_import)
    model.producer_name = "autodice"
    model.functions.extend(src.functions)
    g = model.graph
    g.name = rank.key
    weights: dict[str, None] = {}
    for i in nodes:
        node = graph.nodes[i]
        if node.op_type in SHAPE_OPS and i in graph.followers:
            g.node.append(shape_constant(node, graph.types))
            continue
        g.node.extend(legalize(graph, node, _opset(src)) or [node])
        for t in node.input:
            if graph.is_weight(t):
                weights[t] = None
    pin_batch(g, rank.submodel_inputs)
    g.input.extend(_value_info(graph, s) for s in rank.submodel_inputs)
    g.output.extend(_value_info(graph, s) for s in rank.submodel_outputs)
    return model, [graph.tensors[t] for t in weights]


def write_submodels(graph: Graph, plan: Plan, out_dir: Path) -> None:
    """Write every rank's sub-model under ``out_dir`` (two at a time: the copy runs in the
    kernel, so threads overlap the I/O). A rank's nodes are its layers and followers, in the
    graph's order."""
    members = [sorted(graph.index[n] for n in (*rank.layers, *rank.followers))
               for rank in plan.ranks]
    (out_dir / "models").mkdir(parents=True, exist_ok=True)

    def write(rank: Rank) -> None:
        proto, weights = submodel_proto(graph, rank, members[rank.rank])
        write_model(out_dir / rank.submodel, proto, weights)

    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(write, plan.ranks))
