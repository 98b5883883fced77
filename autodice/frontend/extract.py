"""Writing one ONNX sub-model per rank.

A sub-model holds the rank's layers (followers included; ``Shape`` folded to a constant because
the tensor it measures may live on another rank, and the integer shape arithmetic after it too),
the weights they read, graph inputs = model
inputs it reads + tensors it receives, graph outputs = tensors it sends + model outputs it makes.
Weights are copied from the source file by reference (see :mod:`autodice.onnxio`).
"""

from __future__ import annotations

import threading
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from ..core.model import SHAPE_OPS, Graph, shape_constant
from ..core.onnxwrite import Sources, write_model
from ..core.plan import Plan, Rank, TensorSpec
from .legalize import (
    Constants,
    gather_by_range,
    gelu_in_pnnx_order,
    ir_version,
    legalize,
    lowest_equivalent_opset,
    main_opset,
    pin_batch,
    reduce_axes_as_attributes,
)
from .lower import lower_ranks

INTEGERS = frozenset({TensorProto.INT64, TensorProto.INT32})


def _value_info(graph: Graph, spec: TensorSpec) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(spec.name, graph.types[spec.name].elem_type, spec.shape)


def submodel_proto(graph: Graph, rank: Rank, nodes: list[int]) -> tuple[onnx.ModelProto, list]:
    """The rank's model without initializers, and the weights to append, in first-use order.

    Nodes go through :mod:`.legalize`, so what pnnx reads is what it converts right.
    """
    src = graph.lazy.proto
    model = onnx.ModelProto()
    model.opset_import.extend(src.opset_import)
    model.producer_name = "autodice"
    model.functions.extend(src.functions)
    g = model.graph
    g.name = rank.key
    weights: dict[str, None] = {}
    opset = main_opset(src)
    for i in nodes:
        node = graph.nodes[i]
        if node.op_type in SHAPE_OPS and i in graph.followers:
            g.node.append(shape_constant(node, graph.types))
            continue
        if i in graph.followers and (folded := shape_plumbing(graph, node)):
            g.node.extend(folded)
            continue
        g.node.extend(legalize(graph, node, opset) or [node])
        for t in node.input:
            if graph.is_weight(t):
                weights[t] = None
    constants = Constants(model, graph)
    rewritten = []
    for node in g.node:
        rewritten.extend(gather_by_range(graph, node, constants, opset) or [node])
    del g.node[:]
    g.node.extend(rewritten)
    constants = Constants(model, graph)  # and the Constant nodes the Gathers' rewrites made
    lower_ranks(g, graph, constants, opset, rank.submodel_inputs, rank.submodel_outputs)
    pin_batch(g, rank.submodel_inputs)
    g.input.extend(_value_info(graph, s) for s in rank.submodel_inputs)
    g.output.extend(_value_info(graph, s) for s in rank.submodel_outputs)
    lowest_equivalent_opset(model)  # once inputs and outputs are listed: it checks the model
    reduce_axes_as_attributes(model, constants)
    gelu_in_pnnx_order(g, constants)  # once the outputs are listed: it leaves those as they are
    model.ir_version = ir_version(model)
    # A weight only a rewritten node read (Gather's indices) is not needed any more.
    read = {t for n in g.node for t in n.input}
    return model, [graph.tensors[t] for t in weights if t in read]


def write_submodels(graph: Graph, plan: Plan, out_dir: Path) -> None:
    """Write every rank's sub-model under ``out_dir`` (two at a time: the copy runs in the
    kernel, so threads overlap the I/O). A rank's nodes are its layers and followers, in the
    graph's order.

    The ranks with the most weight bytes start first: the copy is what takes the time, and one
    rank can hold most of it (VGG-19's fc6 is 411 of 548 MB), so the others fill the second
    thread around it instead of delaying its start.
    """
    members = [sorted(graph.index[n] for n in (*rank.layers, *rank.followers))
               for rank in plan.ranks]
    (out_dir / "models").mkdir(parents=True, exist_ok=True)
    todo = iter(sorted(plan.ranks, key=lambda r: -r.memory.params))
    failed: list[BaseException] = []
    lock = threading.Lock()

    # Two plain threads rather than concurrent.futures, whose import (with logging) is ~15 ms
    # of a command that takes half a second.
    def work(sources: Sources) -> None:
        while not failed:
            with lock:
                rank = next(todo, None)
            if rank is None:
                return
            try:
                proto, weights = submodel_proto(graph, rank, members[rank.rank])
                write_model(out_dir / rank.submodel, proto, weights, sources)
            except BaseException as e:  # re-raised below, in the caller's thread
                failed.append(e)

    with Sources() as sources:
        threads = [threading.Thread(target=work, args=(sources,)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if failed:
        raise failed[0]


def shape_plumbing(graph: Graph, node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """A follower computing integers from static shapes (the Shape -> Gather -> Unsqueeze ->
    Concat chains exporters write for a Reshape target), as Constant nodes of its values; None
    when any output's value is not known or not an integer. pnnx then sees a plain constant
    instead of ops it would have to fold itself (and Gather, which ncnn lacks)."""
    values = graph.folded()
    outputs = [t for t in node.output if t]
    if node.op_type == "Constant" or not outputs or any(
            t not in values or values[t].data_type not in INTEGERS for t in outputs):
        return None
    name = node.name or outputs[0]
    return [helper.make_node("Constant", [], [t], name=name if len(outputs) == 1 else f"{name}/{k}",
                             value=values[t]) for k, t in enumerate(outputs)]
