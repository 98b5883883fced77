"""Tensors ncnn can hold: layout plumbing on 5-D and 6-D tensors, rewritten on at most 4 axes.

An ncnn Mat has four axes at most (pnnx drops a leading batch of one), so window attention as
exported cannot be converted: Swin-T partitions 1x56x56x96 into 1x8x7x8x7x96, permutes and
flattens it to 64x49x96, and splits its heads through 64x49x3x3x32; MaxViT-T does the same for
its blocks and grids and runs 5-D einsums and softmaxes in between. Every op that reads or
writes a tensor of five or more axes is rewritten on a view of the same bytes with fewer axes:

* Transpose: axes that stay neighbours are one axis and axes of length one go; a permutation
  that still needs five is done as a few transposes that each need four at most (found by a
  breadth-first search over moves of one block of axes, so it is always found).
* Slice, Split, Concat, Softmax on one axis: (before the axis, the axis, after it).
* Elementwise ops, broadcasting included: neighbouring axes on which every operand is alike
  (all full, or all one) are one axis.
* Einsum: letters of length one go and letters that are neighbours everywhere merge; a batched
  matrix product then becomes MatMul.

A rewritten op reads each input through a Reshape and writes its output through one, so every
tensor of the graph keeps its name, shape and value; the Reshapes then collapse in chains and
the 5-D and 6-D tensors between rewritten ops are gone. A tensor a rank sends or receives
crosses in its ``mat_form`` (``reshape_at_edges``); an op with no rule stays as it is, and
``gen`` names it (``backend.verify.missing_rewrites``).
"""

from __future__ import annotations

import onnx

from ..core.model import Graph
from ..core.plan import TensorSpec
from .legalize import BATCH_OPS, Constants
from .lower_rules import ELEMENTWISE, Lowering


def batched_tensors(graph: Graph) -> frozenset[str]:
    """The tensors whose leading axis pnnx takes for a batch: the model's inputs, what the ops
    that know a batch axis make (a 3-D convolution's 1xCxDxHxW), and what elementwise ops make
    of those. A reshape, transpose or einsum makes a tensor whose leading 1 is just an axis
    (Swin-T's 1x64x3x49x49 scores): pnnx cannot reshape a tensor without a batch into it."""
    batched = set(graph.inputs)
    for node in graph.nodes:
        if node.op_type in BATCH_OPS or (node.op_type in ELEMENTWISE
                                         and any(t in batched for t in node.input)):
            batched.update(node.output)
    return frozenset(batched)


def collapse_reshapes(g: onnx.GraphProto, lowering: Lowering, outputs: set[str]) -> None:
    """Reshape(Reshape(x)) is one Reshape of x, a Reshape to x's own shape is x, where either
    Reshape is one the lowering wrote (the model's own stay as they are, so sub-models with
    nothing to lower are unchanged); then nodes whose outputs nobody reads any more go."""
    producer = {t: n for n in g.node for t in n.output}
    was_read = {t for n in g.node for t in n.input} | outputs
    alias: dict[str, str] = {}
    for node in g.node:
        node.input[:] = [alias.get(t, t) for t in node.input]
        if node.op_type != "Reshape" or not lowering.target_is_exact(node):
            continue
        src = producer.get(node.input[0])
        mine = node.output[0] in lowering.exact
        if src is not None and src.op_type == "Reshape" and (mine or src.output[0]
                                                              in lowering.exact):
            node.input[0] = src.input[0]
            mine = True
        x, y = node.input[0], node.output[0]
        if mine and lowering.shape(x) == lowering.shape(y) and y not in outputs:
            alias[y] = x
    while True:
        read = {t for n in g.node for t in n.input} | outputs
        dead = [n for n in g.node if not any(t in read for t in n.output)
                and all(t in was_read or t in lowering.shapes for t in n.output)]
        if not dead:
            return
        for n in dead:
            g.node.remove(n)


def reshape_at_edges(g: onnx.GraphProto, lowering: Lowering,
                     edges: tuple[TensorSpec, ...]) -> None:
    """A tensor the sub-model receives or sends in another shape than the model gives it (its
    Mat form, see ``mat_form``) is reshaped as it enters or leaves: the nodes read and write
    ``<name>/full`` and ``<name>`` is the received or sent view."""
    outputs = {t for n in g.node for t in n.output}
    full = {s.name: f"{s.name}/full" for s in edges
            if s.name in lowering.graph.types and tuple(lowering.graph.types[s.name].shape)
            != tuple(s.shape)}
    if not full:
        return
    for node in g.node:
        node.input[:] = [full.get(t, t) for t in node.input]
        node.output[:] = [full.get(t, t) for t in node.output]
    for s in edges:
        if s.name in full:
            lowering.shapes[s.name] = tuple(s.shape)
            lowering.shapes[full[s.name]] = tuple(lowering.graph.types[s.name].shape)
            if s.name in outputs:  # made here and sent
                lowering.reshape(s.name, full[s.name], tuple(s.shape), out=s.name)
                tail = lowering.nodes[-2:]
                del lowering.nodes[-2:]
                g.node.extend(tail)
            else:
                lowering.reshape(s.name, s.name, lowering.shapes[full[s.name]], out=full[s.name])
                head = lowering.nodes[-2:]
                del lowering.nodes[-2:]
                rest = list(g.node)
                del g.node[:]
                g.node.extend([*head, *rest])


def lower_ranks(g: onnx.GraphProto, graph: Graph, constants: Constants, opset: int,
                inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]) -> None:
    """Rewrite the ops of ``g`` that touch tensors of more than four axes onto at most four
    (see the module docstring); ``inputs`` and ``outputs`` are the sub-model's, in the shapes
    ranks exchange them."""
    lowering = Lowering(g, graph, constants)
    reshape_at_edges(g, lowering, (*inputs, *outputs))
    lowering.run(opset)
    if lowering.nodes_written:
        collapse_reshapes(g, lowering, {s.name for s in outputs})

