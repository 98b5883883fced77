"""The partition as a graph a page can draw: layers grouped, laid out, cut tensors with bytes.

A DenseNet drawn one marker a layer is a smear. Most of its layers sit on chains (BatchNorm,
Relu, Conv, ... each feeding only the next), so a chain of one key is drawn as one node that
lists its layers: the zoo's DenseNet-121 (668 mapped layers) is drawn as 140 nodes, and every
branch and every cut stays visible. Small models (at most ``EVERY_LAYER`` layers) keep a node
per layer.

Groups are laid out left to right by depth (the longest path from the inputs over groups), which
reads like the diagrams in papers and needs no layout library; the page pans and zooms.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..core.model import Graph
from ..core.plan import Plan
from ..frontend.layers import layer_flops

EVERY_LAYER = 200  # at most this many mapped layers: one node per layer


@dataclass
class _Group:
    rank: int
    nodes: list[int]


def _groups(shown: list[int], rank_of: dict[int, int], preds: dict[int, set[int]],
            succs: dict[int, set[int]]) -> list[_Group]:
    """Chains of one rank merged (a node whose only producer feeds only it joins that
    producer's group) when the model is large; else one group per layer."""
    merge = len(shown) > EVERY_LAYER
    groups: list[_Group] = []
    group_of: dict[int, int] = {}
    for i in shown:  # graph order is topological
        p = next(iter(preds[i])) if len(preds[i]) == 1 else None
        if merge and p is not None and succs[p] == {i} and rank_of[p] == rank_of[i]:
            group_of[i] = group_of[p]
            groups[group_of[i]].nodes.append(i)
        else:
            group_of[i] = len(groups)
            groups.append(_Group(rank_of[i], [i]))
    return groups


def partition_view(plan: Plan, graph: Graph) -> dict:
    """What the page's partition graph draws (JSON-ready): ``nodes`` (a group each: rank, x, y,
    its layers, ops, FLOPs, parameter bytes), ``links`` (group pairs inside a rank), ``cuts``
    (a cut tensor each: its groups, name, bytes) and the counts the page states."""
    stages = [r for r in plan.ranks if r.turns()[0] == r.rank]  # copies share their layers
    rank_by_name = {layer: r.rank for r in stages for layer in r.layers}
    shown = [i for i in range(len(graph.nodes)) if graph.names[i] in rank_by_name]
    rank_of = {i: rank_by_name[graph.names[i]] for i in shown}
    producer = {t: i for i in shown for t in graph.nodes[i].output}
    preds: dict[int, set[int]] = {i: set() for i in shown}
    succs: dict[int, set[int]] = {i: set() for i in shown}
    feeds: dict[tuple[int, int], list[str]] = {}  # (producer, consumer) -> tensors
    for i in shown:
        for t in graph.nodes[i].input:
            if t in producer:
                preds[i].add(producer[t])
                succs[producer[t]].add(i)
                feeds.setdefault((producer[t], i), []).append(t)
    groups = _groups(shown, rank_of, preds, succs)
    group_of = {i: g for g, group in enumerate(groups) for i in group.nodes}

    depth = [0] * len(groups)
    for g, group in enumerate(groups):  # groups are in topological order too
        ins = {group_of[p] for i in group.nodes for p in preds[i]} - {g}
        depth[g] = 1 + max((depth[h] for h in ins), default=-1)
    rows: Counter[int] = Counter()
    nodes = []
    for g, group in enumerate(groups):
        ops = Counter(graph.nodes[i].op_type for i in group.nodes)
        nodes.append({
            "rank": group.rank, "x": depth[g], "y": rows[depth[g]],
            "layers": [graph.names[i] for i in group.nodes],
            "ops": [f"{op}×{n}" if n > 1 else op for op, n in ops.most_common()],
            "flops": sum(layer_flops(graph, i) for i in group.nodes),
            "param_bytes": sum(graph.tensors[t].nbytes for i in group.nodes
                               for t in graph.nodes[i].input if graph.is_weight(t))})
        rows[depth[g]] += 1
    for node in nodes:  # each column centred on 0
        node["y"] = node["y"] - (rows[node["x"]] - 1) / 2

    cut = {e.tensor: e for e in plan.edges}
    links, cuts = set(), []
    for (p, i), tensors in sorted(feeds.items()):
        a, b = group_of[p], group_of[i]
        if a == b:
            continue
        crossing = [t for t in tensors if t in cut and rank_of[p] != rank_of[i]]
        for t in crossing:
            cuts.append({"from": a, "to": b, "tensor": t, "bytes": cut[t].nbytes})
        if not crossing:
            links.add((a, b))
    return {"nodes": nodes, "links": sorted(links), "cuts": cuts, "layers": len(shown),
            "merged": len(shown) > EVERY_LAYER}


def keys_table(plan: Plan, graph: Graph, cost=None) -> list[dict]:
    """A row per rank: where it runs, its layers' FLOPs and bytes, the plan's memory estimate,
    and, given a :class:`~autodice.dse.cost.Cost`, its predicted compute and transfer time."""
    index = {name: i for i, name in enumerate(graph.names)}
    rows = []
    for r in plan.ranks:
        mine = [index[layer] for layer in r.layers if layer in index]
        row = {"rank": r.rank, "key": r.key, "host": r.host, "device": r.device,
               "threads": r.threads, "layers": len(r.layers),
               "copy_of": plan.ranks[r.turns()[0]].key if r.turns()[0] != r.rank else None,
               "flops": sum(layer_flops(graph, i) for i in mine),
               "param_bytes": r.memory.params, "peak_activation_bytes": r.memory.peak_activations,
               "recv_bytes": r.memory.recv_bytes, "send_bytes": r.memory.send_bytes}
        if cost is not None:
            rc = cost.ranks[r.rank]
            row.update(compute_ms=rc.compute_s * 1e3, comm_ms=rc.comm_s * 1e3,
                       memory_bytes=rc.memory)
        rows.append(row)
    return rows
