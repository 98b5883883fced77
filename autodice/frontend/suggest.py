"""A first mapping to start from: contiguous blocks of layers with balanced FLOPs.

Users need a valid mapping before they can profile or search; tests and benchmarks need many.
"""

from __future__ import annotations

from ..core.model import Graph
from .layers import layer_flops


def balanced_mapping(graph: Graph, keys: list[str]) -> dict[str, list[str]]:
    """Cut the mapped layers, in topological order, into ``len(keys)`` runs of similar FLOPs."""
    layers = [i for i in range(len(graph.nodes)) if i not in graph.followers]
    cost = [max(layer_flops(graph, i), 1) for i in layers]
    total = sum(cost)
    mapping: dict[str, list[str]] = {k: [] for k in keys}
    acc, k = 0, 0
    for n, (i, c) in enumerate(zip(layers, cost)):
        # Next key once this one has its share, or when the rest must give each key one layer.
        share_done = acc + c / 2 > total * (k + 1) / len(keys)
        must_move = len(layers) - n <= len(keys) - k - 1
        if k + 1 < len(keys) and mapping[keys[k]] and (share_done or must_move):
            k += 1
        mapping[keys[k]].append(graph.names[i])
        acc += c
    return mapping
