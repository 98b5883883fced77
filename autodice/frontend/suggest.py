"""A first mapping to start from: the layers in order, cut into one contiguous run per key so the
slowest run is as fast as it can be.

Users need a valid mapping before they can profile or search; tests and benchmarks need many.
What a layer costs on a key is given (``autodice.dse.balance`` gives measured milliseconds per
key, from a profile) or, without a measurement, its FLOPs -- the same on every key, and only
roughly time: a 1x1 convolution and a depthwise one of equal FLOPs differ several-fold.
"""

from __future__ import annotations

from collections.abc import Callable

from ..core.errors import AutodiceError
from ..core.mapping import parse_keys
from ..core.model import Graph
from .layers import layer_flops

# (key, layer name) -> what the layer costs on that key (any unit, the same for all keys)
Cost = Callable[[str, str], float]


def balanced_mapping(graph: Graph, keys: list[str], where: str = "keys",
                     cost: Cost | None = None,
                     entry: list[list[float]] | None = None) -> dict[str, list[str]]:
    """Cut the mapped layers, in topological order, into ``len(keys)`` contiguous runs, run k on
    ``keys[k]``, minimising the largest run's cost (a pipeline's period), each key one layer at
    least.

    Args:
        where: how the keys were given, for errors (``--balance``).
        cost: the cost of a layer on a key; None: its FLOPs, whatever the key.
        entry: ``entry[k][a]``, in cost's unit: what key k pays on top of its layers when its run
            starts at layer a (receiving what crosses there); None: nothing.
    Raises:
        AutodiceError: keys that do not parse, repeat, or outnumber the layers (a key with no
            layer is a mapping ``split`` refuses).
    """
    layers = [graph.names[i] for i in range(len(graph.nodes)) if i not in graph.followers]
    if not keys:
        raise AutodiceError(f"{where}: give at least one key")
    parse_keys(keys, where)
    if len(keys) > len(layers):
        raise AutodiceError(f"{where}: {len(keys)} keys for {len(layers)} layers; each key needs "
                            "one")
    if cost is None:
        flops = {graph.names[i]: float(max(layer_flops(graph, i), 1))
                 for i in range(len(graph.nodes)) if i not in graph.followers}
        table = [[flops[name] for name in layers] for _ in keys]
    else:
        table = [[max(float(cost(k, name)), 0.0) for name in layers] for k in keys]
    cuts = min_max_cuts(table, entry)
    return {k: layers[a:e] for k, (a, e) in zip(keys, zip(cuts[:-1], cuts[1:]))}


def min_max_cuts(table: list[list[float]], entry: list[list[float]] | None = None) -> list[int]:
    """Cut points 0 = c0 < c1 < ... < cK = n so run k = layers [c_k, c_k+1) on key k minimises
    max_k entry[k][c_k] + sum(table[k][c_k:c_k+1]) (``entry`` None: all 0).

    For a bound T, the ends a run on key k may have, from each start the runs before it can
    reach, form one interval per start (as far as the sum stays within T: two pointers), so
    which cut points are reachable after each key is a sweep over the layers; T is feasible when
    the last key can end at n. Bisecting T, to a millionth, between 0 and the whole model on
    the slowest key finds the least feasible T, and the reachable sets give its cuts back.
    O(K n) per bound without entry costs; exact for keys of any speeds. A run's entry cost
    depends on its start only, so from each start its cost still grows with its end and its ends
    are still one interval (the right pointer steps back where an entry is dearer).
    """
    n, k = len(table[0]), len(table)
    entry = entry or [[0.0] * (n + 1) for _ in table]
    prefix = []
    for row in table:
        acc = [0.0]
        for c in row:
            acc.append(acc[-1] + c)
        prefix.append(acc)

    def cuts_within(bound: float) -> list[int] | None:
        reach = [[True] + [False] * n]  # reach[j][p]: the first j runs can end at p
        ends = []  # ends[j][a]: the furthest end of a run on key j from a within the bound
        for j in range(k):
            far, e = [0] * (n + 1), 0
            for a in range(n):
                e = max(e, a)
                while e > a and entry[j][a] + prefix[j][e] - prefix[j][a] > bound:
                    e -= 1  # a dearer entry than the last start's
                while e < n and entry[j][a] + prefix[j][e + 1] - prefix[j][a] <= bound:
                    e += 1
                far[a] = e
            ends.append(far)
            delta = [0] * (n + 2)
            for a in range(n):
                if reach[j][a] and far[a] > a:
                    delta[a + 1] += 1
                    delta[far[a] + 1] -= 1
            row, open_ = [False] * (n + 1), 0
            for p in range(n + 1):
                open_ += delta[p]
                row[p] = open_ > 0
            reach.append(row)
        if not reach[k][n]:
            return None
        cuts = [n]
        for j in reversed(range(k)):
            e = cuts[0]
            cuts.insert(0, next(a for a in range(e - 1, -1, -1)
                                if reach[j][a] and ends[j][a] >= e))
        return cuts

    lo, hi = 0.0, max(acc[-1] + max(row) for acc, row in zip(prefix, entry))
    best = cuts_within(hi)
    assert best is not None  # every run within the slowest key's whole model and dearest entry
    while hi - lo > 1e-6 * hi:  # a millionth of the period: well below any timer's noise
        mid = (lo + hi) / 2
        got = cuts_within(mid)
        if got is None:
            lo = mid
        else:
            hi, best = mid, got
    return best
