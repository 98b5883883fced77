"""A first mapping to start from: contiguous blocks of layers with balanced FLOPs.

Users need a valid mapping before they can profile or search; tests and benchmarks need many.
"""

from __future__ import annotations

from ..core.errors import AutodiceError, Problems
from ..core.model import Graph
from ..core.spec import parse_key
from .layers import layer_flops


def balanced_mapping(graph: Graph, keys: list[str], where: str = "keys") -> dict[str, list[str]]:
    """Cut the mapped layers, in topological order, into ``len(keys)`` runs of similar FLOPs.

    Args:
        where: how the keys were given, for errors (``--balance``).
    Raises:
        AutodiceError: keys that do not parse, repeat, or outnumber the layers (a key with no
            layer is a mapping ``split`` refuses).
    """
    layers = [i for i in range(len(graph.nodes)) if i not in graph.followers]
    problems = Problems()
    for key in dict.fromkeys(keys):
        try:
            parse_key(key)
        except ValueError as e:
            problems.add(f'{where}: key "{key}": {e}')
        if keys.count(key) > 1:
            problems.add(f'{where}: key "{key}" is given {keys.count(key)} times')
    if not problems and len(keys) > len(layers):
        problems.add(f"{where}: {len(keys)} keys for {len(layers)} layers; each key needs one")
    if not keys:
        raise AutodiceError(f"{where}: give at least one key")
    problems.raise_if_any()
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
