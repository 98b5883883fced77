"""Pooling ncnn cannot compute as ONNX states it, spelled in ops it can (see :mod:`.exporters`).

ncnn's pooling has no dilation, keeps ceil mode's last window where ONNX drops it (the window
would start on the padding), and pnnx mis-converts a MaxPool whose pads differ at an axis's two
ends. A max pool is then one grouped convolution that gathers every window's elements (one-hot
kernels: each element times 1, the padding the lowest float, which times 0 is still 0) and a
plain max pool over them; an average pool is a convolution of ones, each window's sum divided
by the count ONNX divides it by.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from ..core.model import Graph
from .nodes import Nodes, Rewrite, attr, ints, shape_of

LOWEST = float(np.finfo(np.float32).min)  # pads a max-pool's window (0 x this is still 0)


def _pool_geometry(graph: Graph, node: onnx.NodeProto):
    """(x, y, kernel, strides, dilations, pads) of a 2-D pool with static shapes, else None."""
    x, y = shape_of(graph, node.input[0]), shape_of(graph, node.output[0])
    if x is None or y is None or len(x) != 4 or x[0] != 1:
        return None
    kernel = list(attr(node, "kernel_shape"))
    strides = list(attr(node, "strides", [1, 1]))
    dilations = list(attr(node, "dilations", [1, 1]))
    pads = list(attr(node, "pads", [0, 0, 0, 0]))
    return x, y, kernel, strides, dilations, pads


def _needs_own_pooling(graph: Graph, node: onnx.NodeProto) -> bool:
    """Dilations, or ceil mode where ONNX has one window fewer than ceil mode alone gives."""
    geo = _pool_geometry(graph, node)
    if node.op_type not in ("MaxPool", "AveragePool") or geo is None or len(node.output) > 1:
        return False
    x, y, kernel, strides, dilations, pads = geo
    if any(d != 1 for d in dilations) or (node.op_type == "MaxPool" and pads[:2] != pads[2:]):
        return True
    if not attr(node, "ceil_mode", 0):
        return False
    for i in range(2):
        span = (kernel[i] - 1) * dilations[i] + 1
        ceil_out = math.ceil((x[2 + i] + pads[i] + pads[2 + i] - span) / strides[i]) + 1
        if ceil_out != y[2 + i]:
            return True
    return False


def pool_by_convolution(graph: Graph, node: onnx.NodeProto, opset: int) -> Rewrite:
    """A MaxPool or AveragePool ncnn cannot compute as it is (see the module docstring)."""
    if not _needs_own_pooling(graph, node):
        return None
    (_, c, h, w), (_, _, oh, ow), kernel, strides, dilations, pads = _pool_geometry(graph, node)
    spans = [(kernel[i] - 1) * dilations[i] + 1 for i in range(2)]
    # Pad each end so that exactly the windows ONNX keeps fit (ceil mode's kept part windows).
    ends = [max(pads[2 + i], (o - 1) * strides[i] + spans[i] - (size + pads[i]))
            for i, (o, size) in enumerate(((oh, h), (ow, w)))]
    n = Nodes(node)
    if node.op_type == "MaxPool":
        k = kernel[0] * kernel[1]
        weights = np.zeros((c * k, 1, *spans), np.float32)
        for ch in range(c):
            for i in range(kernel[0]):
                for j in range(kernel[1]):
                    weights[ch * k + i * kernel[1] + j, 0, i * dilations[0], j * dilations[1]] = 1
        padded = _pad_with(n, node.input[0], c, (h, w), (pads[0], pads[1], ends[0], ends[1]),
                           LOWEST)
        taken = n.op("Conv", [padded, n.const("onehot", weights)], "windows", group=c,
                     kernel_shape=spans, strides=strides)
        # Each window's k elements on an axis of their own; a plain max pool over that axis
        # (pnnx converts it whatever the opset, ReduceMax's axes it reads only up to 17).
        flat = n.op("Reshape", [taken, n.const("flat", ints([1, c, k, oh * ow]))], "flat")
        most = n.op("MaxPool", [flat], "max", kernel_shape=[k, 1], strides=[k, 1])
        n.op("Reshape", [most, n.const("shape", ints([1, c, oh, ow]))], out=node.output[0])
        return n.nodes
    summed = n.op("Conv", [node.input[0], n.const("ones", np.ones((c, 1, *kernel), np.float32))],
                  "sum", group=c, kernel_shape=kernel, strides=strides, dilations=dilations,
                  pads=[pads[0], pads[1], ends[0], ends[1]])
    counts = _window_counts(node, (h, w), (oh, ow), kernel, strides, dilations, pads)
    n.op("Mul", [summed, n.const("scale", (1.0 / counts).astype(np.float32)[None, None])],
         out=node.output[0])
    return n.nodes


def _pad_with(n: Nodes, x: str, c: int, size: tuple[int, int], pads: tuple[int, ...],
              value: float) -> str:
    """``x`` (1xCxHxW) with ``pads`` (top, left, bottom, right) of ``value``, by Concat."""
    cur, (h, w) = x, size
    for axis, before, after in ((2, pads[0], pads[2]), (3, pads[1], pads[3])):
        if not before and not after:
            continue
        parts = []
        for side, count in (("before", before), ("after", after)):
            if count:
                shape = [1, c, h, w]
                shape[axis] = count
                parts.append((side, n.const(f"pad{axis}{side}",
                                            np.full(shape, value, np.float32))))
        cur = n.op("Concat", [p for s, p in parts if s == "before"] + [cur]
                   + [p for s, p in parts if s == "after"], f"padded{axis}", axis=axis)
        if axis == 2:
            h += before + after
        else:
            w += before + after
    return cur


def _window_counts(node, size, out, kernel, strides, dilations, pads) -> np.ndarray:
    """What ONNX divides each window's sum by: its elements inside the input
    (count_include_pad=0), or inside the input and its pads."""
    include = bool(attr(node, "count_include_pad", 0))
    per_axis = []
    for i in range(2):
        lo, hi = (-pads[i], size[i] + pads[2 + i]) if include else (0, size[i])
        per_axis.append(np.array([sum(lo <= o * strides[i] - pads[i] + a * dilations[i] < hi
                                      for a in range(kernel[i])) for o in range(out[i])],
                                 np.float32))
    return np.outer(*per_axis)
