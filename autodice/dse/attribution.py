"""From ncnn layers to ONNX layers: whose time is whose.

Per layer, not per sub-model: the profiler extracts the output blob of every ncnn layer in
order, so each extract runs exactly one ncnn layer. Those are not the ONNX layers a mapping
names — pnnx fuses Conv+BatchNorm+ReLU into one Convolution, drops Dropout, inserts Split — and
it renames everything, so names cannot be matched. Values can: the profiler fingerprints every
ncnn blob (element count, sum, sum |x|, sum x^2) on a seeded input and onnxruntime does the same
for every ONNX layer output. An ncnn layer whose output matches ONNX tensor T computed T and every
ONNX layer before T that no earlier ncnn layer matched (its fused partners); its time (plus that
of unmatched ncnn layers before it, e.g. Split) is shared among them in proportion to their FLOPs,
so a fused ReLU costs next to nothing and the Convolution carries the time. Exposing every layer
output as a graph output instead would stop pnnx from fusing and make ncnn clone blobs for
in-place layers, so what it measured would not be what a rank runs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..core.model import Graph
from ..frontend.check import every_value
from ..frontend.layers import layer_flops

# Fingerprints of one tensor from ncnn and onnxruntime agree to ~1e-5 relative; different tensors
# of one count differ by far more.
MATCH_RTOL = 1e-3


def fingerprint(array: np.ndarray) -> tuple[int, float, float, float]:
    """(count, sum, sum |x|, sum x^2): what profile_layers prints for an ncnn blob."""
    a = np.asarray(array, dtype=np.float64).ravel()
    return (a.size, float(a.sum()), float(np.abs(a).sum()), float(np.dot(a, a)))


def fingerprint_onnx(graph: Graph, path: Path, feeds: list[Path],
                     mappable: list[int]) -> tuple[dict[str, tuple], float]:
    """Fingerprints of every mappable layer's float outputs, computed by onnxruntime, and the
    largest finite magnitude among them (whether a GPU can compute the model in fp16)."""
    wanted = [t for i in mappable for t in graph.nodes[i].output if t]
    values = every_value(path, {n: np.load(p) for n, p in zip(graph.inputs, feeds)}, wanted)
    arrays = {n: np.asarray(v) for n, v in values.items()}
    floats = [(n, v) for n, v in arrays.items() if v.dtype.kind == "f"]
    largest = max((float(np.abs(v[np.isfinite(v)]).max(initial=0.0)) for _, v in floats),
                  default=0.0)
    return {n: fingerprint(v) for n, v in floats}, largest


def match_layers(graph: Graph, ncnn_layers: list[dict], reference: dict[str, tuple],
                 mappable: list[int]) -> tuple[list[list[int]], list[int]]:
    """For each timed ncnn layer, the ONNX layers (node positions) its time belongs to.

    An ncnn output that matches ONNX tensor T (the earliest such tensor not yet claimed, so an
    alias such as Dropout's output goes to the alias) claims T's producer and every unclaimed
    mappable ancestor. An ncnn layer that matches nothing new (Split, pnnx's own reshapes) gets
    an empty group: its time goes to the next group. ONNX layers never claimed (no blob matched
    them or a descendant) join the last group; they are returned too.
    """
    allowed = set(mappable)
    by_count: dict[int, list[str]] = {}
    order = {t: k for k, i in enumerate(mappable) for t in graph.nodes[i].output if t}
    for t in sorted(reference, key=lambda t: order.get(t, len(order))):
        if t in order:
            by_count.setdefault(reference[t][0], []).append(t)
    claimed: set[int] = set()
    groups: list[list[int]] = []
    for layer in ncnn_layers:
        group: list[int] = []
        for top in layer["tops"]:
            t = next((t for t in by_count.get(int(top[0]), [])
                      if graph.producer[t] not in claimed and _same(top, reference[t])), None)
            if t is not None:
                group += _claim(graph, graph.producer[t], claimed, allowed)
        groups.append(sorted(group))
    unmatched = [i for i in mappable if i not in claimed]
    if unmatched:
        last = max((k for k, g in enumerate(groups) if g), default=len(groups) - 1)
        groups[last] = sorted(groups[last] + unmatched)
    return groups, unmatched


def _same(a, b) -> bool:
    if any(v is None or not np.isfinite(v) for v in (*a, *b)):
        return False  # an overflowed blob is nobody's fingerprint
    _, s, asum, sq = (float(v) for v in a)
    _, s2, asum2, sq2 = b
    scale = max(asum2, 1e-30)
    return (abs(s - s2) <= MATCH_RTOL * scale + 1e-6 and abs(asum - asum2) <= MATCH_RTOL * scale
            + 1e-6 and abs(sq - sq2) <= MATCH_RTOL * max(sq2, 1e-30) + 1e-9)


def _claim(graph: Graph, start: int, claimed: set[int], allowed: set[int]) -> list[int]:
    """``start`` and its unclaimed ancestors among ``allowed``, now claimed."""
    got, stack = [], [start]
    while stack:
        i = stack.pop()
        if i in claimed or i not in allowed:
            continue
        claimed.add(i)
        got.append(i)
        stack.extend(graph.producer[t] for t in graph.nodes[i].input if t in graph.producer)
    return got


def attribute_times(graph: Graph, raw: dict, groups: list[list[int]],
                    threads: tuple[int, ...]) -> dict[int, dict[int, float]]:
    """threads -> node position -> median ms: each run's group time split by FLOPs, then the
    median over runs (a group's own time is a sum of ncnn layers, unmatched ones carried in)."""
    flops = {i: max(layer_flops(graph, i), 1) for g in groups for i in g}
    out: dict[int, dict[int, float]] = {}
    for t in threads:
        runs = np.asarray(raw["runs"][str(t)]["layer_ms"], dtype=float)  # runs x ncnn layers
        med = np.median(_spread(groups, runs, flops, len(graph.nodes)), axis=0)
        out[t] = {i: float(med[i]) for i in range(len(graph.nodes))}
    return out


def attribute_bytes(graph: Graph, raw: dict, groups: list[list[int]]) -> dict[str, np.ndarray]:
    """"loaded", "resident", "workspace" -> bytes per node position: each ncnn layer's figures
    from ``profile_layers`` split among its group, weights by ONNX weight bytes (a fused
    Conv+BatchNorm puts them on the Conv), workspace by FLOPs as its time."""
    params = {i: graph.weight_bytes(i) + 1 for g in groups for i in g}
    flops = {i: max(layer_flops(graph, i), 1) for g in groups for i in g}
    return {k: _spread(groups, np.array([[float(x[k]) for x in raw["layers"]]]),
                       flops if k == "workspace" else params, len(graph.nodes))[0]
            for k in ("loaded", "resident", "workspace")}


def _spread(groups: list[list[int]], values: np.ndarray, weights: dict[int, float],
            n_nodes: int) -> np.ndarray:
    """(runs, ncnn layers) -> (runs, nodes): each ncnn layer's value shared among its group's
    nodes in proportion to ``weights``; a layer whose group is empty (Split, pnnx's reshapes)
    carries its value into the next group, trailing ones into the last non-empty group."""
    per_node = np.zeros((values.shape[0], n_nodes))
    carry = np.zeros(values.shape[0])
    last = next((g for g in reversed(groups) if g), [])
    for k, group in enumerate(groups):
        carry = carry + values[:, k]
        if group:
            total = sum(weights[i] for i in group)
            for i in group:
                per_node[:, i] += carry * (weights[i] / total)
            carry = np.zeros(values.shape[0])
    if carry.any():
        total = sum(weights[i] for i in last)
        for i in last:
            per_node[:, i] += carry * (weights[i] / total)
    return per_node
