"""Writing one ONNX sub-model per rank.

A sub-model holds the rank's layers (followers included; ``Shape`` folded to a constant because
the tensor it measures may live on another rank), the weights they read, graph inputs = model
inputs it reads + tensors it receives, graph outputs = tensors it sends + model outputs it makes.
Weights are copied from the source file by reference (see :mod:`autodice.onnxio`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import onnx
from onnx import helper

from .model import SHAPE_OPS, Graph, shape_constant
from .onnxio import write_model
from .place import Placement
from .plan import Plan, Rank, TensorSpec


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


def legalize(graph: Graph, node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto] | None:
    """The same function in a spelling pnnx converts correctly, or None if ``node`` is fine.

    Before opset 13, Softmax(axis=a) flattens the input to 2-D at ``a``; pnnx converts that
    wrongly for inputs of rank > 2 (SqueezeNet's 1x1000x1x1 comes out all ones). It becomes
    Reshape to 2-D, Softmax, Reshape back.
    """
    shape = graph.types[node.input[0]].shape if node.input else ()
    if node.op_type in LEGACY_SOFTMAX and opset < 13 and len(shape) > 2:
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1) % len(shape)
        rows = 1
        for d in shape[:axis]:
            rows *= d
        return _through_2d(graph, node, [rows, -1], axis=1)
    return None


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
    g.input.extend(_value_info(graph, s) for s in rank.submodel_inputs)
    g.output.extend(_value_info(graph, s) for s in rank.submodel_outputs)
    return model, [graph.tensors[t] for t in weights]


def write_submodels(graph: Graph, plan: Plan, placement: Placement, out_dir: Path) -> None:
    """Write every rank's sub-model under ``out_dir`` (two at a time: the copy runs in the
    kernel, so threads overlap the I/O)."""
    members: list[list[int]] = [[] for _ in plan.ranks]
    for i, ranks in enumerate(placement.node_ranks):
        for r in ranks:
            members[r].append(i)
    (out_dir / "models").mkdir(parents=True, exist_ok=True)

    def write(rank: Rank) -> None:
        proto, weights = submodel_proto(graph, rank, members[rank.rank])
        write_model(out_dir / rank.submodel, proto, weights)

    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(write, plan.ranks))
