"""Data parallelism: a stage copied onto more keys, taking turns frame by frame.

``"edge03_arm0": {"replicates": "edge02_arm0"}`` gives edge03_arm0 a copy of edge02_arm0's layers:
frame f goes to the stage's ranks in turn (f modulo their count), and whoever sends to or
receives from the stage picks the copy whose turn it is, so results still come back in frame
order and the stage's throughput grows with its copies. The plan is made for the mapping
without the copies, then each copy becomes a rank of its own (its key, host, cores and a copy
of the sub-model, weights included), listed in its stage's ``replicas``; edges keep naming the
stage's first rank and the program expands them to the whole stage.
"""

from __future__ import annotations

from dataclasses import replace

from ..core.mapping import Mapping, Resource
from ..core.plan import Edge, Plan, Rank


def without_replicas(mapping: Mapping) -> Mapping:
    """The mapping with the copying keys left out: what the passes plan."""
    return replace(mapping, entries=tuple((k, v) for k, v in mapping.entries
                                          if k not in mapping.replicas), replicas={})


def add_replicas(plan: Plan, mapping: Mapping, resources: tuple[Resource, ...],
                 slots: tuple[tuple[int, ...], ...]) -> Plan:
    """``plan`` (of :func:`without_replicas`) with every copy as a rank of its own, ranks
    renumbered into the mapping's key order.

    Args:
        resources, slots: every key's resource and cores, in the full mapping's order.
    """
    if not mapping.replicas:
        return plan
    keys = [k for k, _ in mapping.entries]
    new_rank = {r.rank: keys.index(r.key) for r in plan.ranks}
    stage_of = {k: mapping.replicas.get(k, k) for k in keys}
    stages = {k: tuple(keys.index(q) for q in keys if stage_of[q] == k)
              for k in keys if k not in mapping.replicas}

    def moved(e: Edge) -> Edge:
        return replace(e, src=new_rank[e.src], dst=tuple(new_rank[d] for d in e.dst))

    edges = tuple(moved(e) for e in plan.edges)
    by_tag = {e.tag: e for e in edges}
    by_key = {r.key: r for r in plan.ranks}
    ranks: list[Rank] = []
    for k, key in enumerate(keys):
        source = by_key[stage_of[key]]
        res = resources[k]
        group = stages[stage_of[key]]
        ranks.append(replace(
            source, rank=k, key=key, host=res.host, device=res.kind, gpu_index=res.gpu_index,
            slots=slots[k], threads=len(res.cores) if res.kind == "cpu" else 1,
            submodel=f"models/{key}.onnx",
            recv=tuple(by_tag[e.tag] for e in source.recv),
            send=tuple(by_tag[e.tag] for e in source.send),
            replicas=group if len(group) > 1 else ()))
    return replace(plan, ranks=tuple(ranks), edges=edges)
