"""Horizontal partitioning: one layer computed by several keys, as a rewrite of the model.

A layer listed under k keys is split k ways before anything else happens: the model is rewritten
so each key gets a *part* of the layer, Slice nodes cut what each part reads (on the producer's
key, so only the slice travels), and a Concat node puts the whole tensor back together on the
key of the first layer that needs it whole. Placement, edges, steps, sub-models and the program
then see an ordinary vertical mapping of the rewritten model, so the early-post /
send-when-ready discipline and pipelining hold unchanged, and the sub-models, tables and memory
estimate say exactly which slice each rank holds and sends.

Two splits (``channels.py``, ``rows.py``):

* ``channels`` (Conv with any group count, Gemm, MatMul by a weight): each part computes a range
  of output channels and holds only its slice of the weights -- what lets a small board hold
  part of VGG's fully connected layers. Layers that act per channel (activations, BatchNorm,
  Dropout...) listed under the same keys follow the split without gathering.
* ``rows`` (Conv, MaxPool, AveragePool, per-element layers, Add/Mul/... and Concat over
  channels): each part computes a band of output rows from its band of input rows plus the halo
  the kernel, stride, dilation and padding need. Layers split by rows over the same keys keep
  their bands (fused tiles: the halo of a whole run is cut once, at its start), through
  branches and joins -- a residual block adds band to band; the bands are gathered only where a
  layer needs the whole map.

A tensor read by several layers keeps its parts after one reader gathers it, so a branch that
needs it whole and a branch that goes on in parts do not disturb each other.

Shares: equal by default, or given per key (``{"layer": "fc6", "share": 0.7}``), e.g. in
proportion to the keys' speed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx

from ...core.errors import Problems
from ...core.model import Graph
from ...core.onnxio import LazyModel
from ...core.onnxwrite import TensorFile
from .channels import split_channels
from .rows import split_rows
from .state import CHANNEL_LAYERS, KINDS, Derived, Split, State

__all__ = ["KINDS", "Derived", "Rewrite", "Split", "default_kind", "split_layers"]


@dataclass
class Rewrite:
    """What splitting made: the new model, which key runs each new node, what each one is."""

    lazy: LazyModel
    assigned: dict[str, str]  # new layer name -> key
    derived: dict[str, Derived]
    replaced: set[str]  # original layer names that no longer exist


def default_kind(op: str) -> str:
    return "channels" if op in CHANNEL_LAYERS else "rows"


def _named(node: onnx.NodeProto, name: str) -> onnx.NodeProto:
    """``node`` under its layer name where that is not its own (a repeated name got ``_1``...):
    the rewritten model's names are made again from its nodes', and the repeats are counted
    anew there, so with a split layer gone the next one's ``_1`` would go to another layer."""
    if (node.name or (node.output[0] if node.output else node.op_type)) == name:
        return node
    renamed = onnx.NodeProto()
    renamed.CopyFrom(node)
    renamed.name = name
    return renamed


def split_layers(graph: Graph, splits: list[Split], key_of: dict[str, str], work: Path | None,
                 where: str = "mapping.json") -> Rewrite:
    """Rewrite ``graph``'s model so each split layer becomes its parts.

    Args:
        key_of: the key of every layer the mapping lists under one key (Slices go there).
        work: a folder for the sliced weights (copied into sub-models by reference later);
            None plans only (shapes, no weights written: what the search needs).

    Raises:
        AutodiceError: a layer type with no rule for the split asked, or a split finer than
            the tensor (one line per layer and key).
    """
    by_layer = {s.layer: s for s in splits}
    problems = Problems()
    weights = TensorFile(work / "slices.bin") if work is not None else None
    state = State(graph, key_of, weights, problems, where)
    try:
        out_nodes: list[onnx.NodeProto] = []
        for i, node in enumerate(graph.nodes):
            name = graph.names[i]
            split = by_layer.get(name)
            if split is None:
                out_nodes.extend(state.gather_inputs(node, key_of.get(name)))
                out_nodes.append(_named(node, name))
                continue
            kind = split.kind or state.follows(node, split) or default_kind(node.op_type)
            rule = {"channels": split_channels, "rows": split_rows}[kind]
            out_nodes.extend(rule(state, name, node, split))
        out_nodes.extend(state.gather_outputs())
    finally:
        if weights is not None:
            weights.close()
    problems.raise_if_any()
    proto = onnx.ModelProto()
    proto.CopyFrom(graph.lazy.proto)
    del proto.graph.node[:]
    proto.graph.node.extend(out_nodes)
    lazy = LazyModel(graph.lazy.path, proto, {**graph.lazy.tensors, **state.new_tensors},
                     {**graph.lazy.small, **state.new_small})
    return Rewrite(lazy, state.assigned, state.derived, set(by_layer))
