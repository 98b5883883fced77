"""Building the nodes of a rewrite: names under the rewritten node's, constants, attributes.

The rules of :mod:`.exporters` and :mod:`.pooling` spell one ONNX node as several; each new
tensor and node is named under the node it replaces, so a rewritten model still reads as the
model it came from.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..core.model import Graph

Rewrite = list[onnx.NodeProto] | None  # the nodes that compute the same, or None: keep it


def attr(node: onnx.NodeProto, name: str, default=None):
    a = next((a for a in node.attribute if a.name == name), None)
    if a is None:
        return default
    value = helper.get_attribute_value(a)
    return value.decode() if isinstance(value, bytes) else value


def with_attrs(node: onnx.NodeProto, drop: tuple[str, ...] = (), **attrs) -> onnx.NodeProto:
    """A copy of ``node`` without the attributes ``drop`` and with ``attrs`` set."""
    new = onnx.NodeProto()
    new.CopyFrom(node)
    keep = [a for a in new.attribute if a.name not in drop and a.name not in attrs]
    del new.attribute[:]
    new.attribute.extend(keep + [helper.make_attribute(k, v) for k, v in attrs.items()])
    return new


class Nodes:
    """The nodes of one rewrite: their names and tensors under the rewritten node's name."""

    def __init__(self, node: onnx.NodeProto):
        self.name = node.name or node.output[0]
        self.nodes: list[onnx.NodeProto] = []

    def const(self, suffix: str, value: np.ndarray) -> str:
        name = f"{self.name}/{suffix}_value"
        self.nodes.append(helper.make_node("Constant", [], [name], name=name,
                                           value=numpy_helper.from_array(value, name)))
        return name

    def op(self, op_type: str, inputs: list[str], suffix: str | None = None,
           out: str | None = None, **attrs) -> str:
        name = f"{self.name}/{suffix}" if suffix else self.name
        y = out or name
        self.nodes.append(helper.make_node(op_type, inputs, [y], name=name, **attrs))
        return y


# A rewritten node's doc_string names the node it came from, so errors about the sub-model name
# the op the user's model has ("a Slice, from Split node "s"") rather than only its new spelling.
_FROM = "autodice: from ONNX "


def mark_origin(nodes: list[onnx.NodeProto], node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """``nodes`` (a rewrite of ``node``), each marked as coming from it where it is new."""
    for n in nodes:
        if n is not node:
            n.doc_string = f"{_FROM}{node.op_type} {node.name or node.output[0]}"
    return nodes


def origin(node: onnx.NodeProto) -> tuple[str, str] | None:
    """(op type, name) of the model's node that ``node`` was rewritten from, or None."""
    if not node.doc_string.startswith(_FROM):
        return None
    op, _, name = node.doc_string[len(_FROM):].partition(" ")
    return op, name


def shape_of(graph: Graph, tensor: str) -> tuple[int, ...] | None:
    t = graph.types.get(tensor)
    return tuple(t.shape) if t is not None and t.static else None


def ints(values: np.ndarray | list) -> np.ndarray:
    return np.array(values, np.int64)
