"""Data and horizontal parallelism proposed on top of the searched front.

The genes encode vertical mappings (each layer on one resource). From each of the front's most
promising points this step tries, greedily, what the other two kinds add (mostly with the
resources the point leaves idle), and keeps what the cost model says pays:

* **copies** (data parallelism): the bottleneck stage copied onto an idle resource, the copies
  taking turns frame by frame -- more throughput for more memory;
* **a split layer** (horizontal, by channels): the heaviest layer of the bottleneck stage shared
  with an idle resource in proportion to the two resources' speed -- more throughput; or the
  largest weights of the fullest board shared with an idle resource of another board, else with
  the keys of the leanest other board -- less memory on the fullest board.

Every proposal is planned by the compiler's own passes (:func:`partition_mapping`) and priced
from its plan (:func:`plan_cost`), so it is a mapping ``split`` accepts and its figures are the
plan's. The front is then the non-dominated set of the searched and the proposed points.
"""

from __future__ import annotations

import numpy as np

from ..core.errors import AutodiceError
from ..core.mapping import mapping_from
from ..core.model import Graph
from ..core.spec import Platform
from ..frontend.split import partition_mapping
from .cost import Cost, plan_cost
from .front import Point
from .slots import Slot, candidate_slots
from .timing import Timing

KINDS = ("data", "horizontal")
SPLITTABLE = frozenset({"Conv", "Gemm", "MatMul"})


def expand(points: tuple[Point, ...], graph: Graph, platform: Platform, timing: Timing,
           kinds: tuple[str, ...], budget: int = 6, steps: int = 3, wire: str = "fp32"
           ) -> list[Point]:
    """Proposals grown from the ``budget`` fastest and leanest points in fp32, ``steps`` moves
    each (copies and split layers are priced from plans, which hold no precision).

    Returns:
        The new points (named ``<point>+<move>...``), each better than where it started.
    """
    names = [graph.names[i] for i in range(len(graph.nodes)) if i not in graph.followers]
    slots = tuple(s for s in candidate_slots(timing, names) if not s.int8)
    points = tuple(p for p in points if not p.precision)
    by_speed = sorted(points, key=lambda p: -p.cost.throughput)[:budget // 2 + 1]
    by_memory = sorted(points, key=lambda p: p.cost.max_memory)[:budget // 2]
    grown: list[Point] = []
    starts = {p.name: p for p in [*by_speed, *by_memory]}  # each point once, in that order
    for start in starts.values():
        current = start
        for _ in range(steps):
            better = _best_move(current, graph, platform, timing, slots, kinds, wire)
            if better is None:
                break
            grown.append(better)
            current = better
    return grown


def _best_move(p: Point, graph: Graph, platform: Platform, timing: Timing,
               slots: tuple[Slot, ...], kinds: tuple[str, ...], wire: str) -> Point | None:
    """The move that gains most throughput (or memory on the fullest board), if any does."""
    by_key = {s.key: s for s in slots}  # every key of a point is a slot's
    idle = _idle(p.mapping, slots, by_key)
    slow = max(p.cost.ranks, key=lambda r: max(r.compute_s + r.comm_s, r.span_s))
    tries: list[tuple[str, dict]] = []
    for s in idle[:3]:
        if "data" in kinds and not isinstance(p.mapping[slow.key], dict):
            tries.append((f"copy:{s.key}", {**p.mapping, s.key: {"replicates": slow.key}}))
        if "horizontal" in kinds:
            layer = _heaviest(p.mapping.get(slow.key), graph, timing, slow.host)
            if layer:
                tries.append((f"split:{s.key}", _share(p.mapping, layer, s.key)))
    if "horizontal" in kinds:
        full = max(p.cost.devices, key=lambda d: d.memory).host
        big = _largest_weights(p.mapping, graph, full, by_key)
        for key in _spread_to(p, idle, full, by_key) if big else ():
            tries.append((f"spread:{key}", _share(p.mapping, big, key)))
    best = None
    for move, mapping in tries:
        cost = _price(mapping, graph, platform, timing, wire)
        if cost is None:
            continue
        # Leaner at any speed: a board that cannot hold the weights cannot run the mapping at
        # all, and the front keeps the proposal only where nothing else is as lean and as fast.
        faster = cost.throughput > p.cost.throughput * 1.02
        leaner = cost.max_memory < p.cost.max_memory * 0.98
        if (faster or leaner) and (best is None or _score(cost) > _score(best[2])):
            best = (move, mapping, cost)
    if best is None:
        return None
    return Point(f"{p.name}+{best[0]}", best[1], best[2], proposed=True)


def _spread_to(p: Point, idle: list[Slot], full: str, by_key: dict[str, Slot]) -> list[str]:
    """Keys that may take a share of the fullest board's largest weights: idle resources of
    other boards, else the keys already on the leanest other board (a share of a layer needs no
    free core of its own: searched points often use every resource)."""
    keys = [s.key for s in idle[:3] if s.host != full]
    if keys:
        return keys
    others = sorted((d for d in p.cost.devices if d.host != full), key=lambda d: d.memory)
    return [k for d in others[:1] for k, v in p.mapping.items()
            if isinstance(v, list) and by_key[k].host == d.host][:2]


def _score(c: Cost) -> float:
    return c.throughput / max(c.max_memory, 1) ** 0.25


def _price(mapping: dict, graph: Graph, platform: Platform, timing: Timing,
           wire: str) -> Cost | None:
    """The plan's cost of a proposal, or None if the passes refuse it (no rule for a split)."""
    try:
        done = partition_mapping(graph, mapping_from(mapping, "proposal"), platform,
                                 graph.path.parent)
    except AutodiceError:
        return None
    return plan_cost(done.plan, timing, done.graph, wire=wire)


def _idle(mapping: dict, slots: tuple[Slot, ...], by_key: dict[str, Slot]) -> list[Slot]:
    """Resources whose cores (or GPU) no key of ``mapping`` uses, fastest-looking first."""
    used = set().union(*(by_key[key].resources() for key in mapping))
    free = [s for s in slots if not s.resources() & used]
    return sorted(free, key=lambda s: (-s.gpu, -s.threads, s.key))


def _heaviest(layers, graph: Graph, timing: Timing, host: str) -> str | None:
    """The splittable layer of ``layers`` with the most time on ``host``'s one core."""
    if not isinstance(layers, list):
        return None
    names = [n for n in layers if isinstance(n, str) and len(graph.resolve(n)) == 1
             and graph.nodes[graph.resolve(n)[0]].op_type in SPLITTABLE]
    if not names:
        return None
    times = timing.seconds(host, [graph.names[graph.resolve(n)[0]] for n in names], 1)
    return names[int(np.argmax(times))]


def _largest_weights(mapping: dict, graph: Graph, host: str,
                     by_key: dict[str, Slot]) -> str | None:
    """The splittable layer with the largest weights on ``host``'s keys."""
    best, size = None, 0
    for key, layers in mapping.items():
        if not isinstance(layers, list) or by_key[key].host != host:
            continue
        for n in layers:
            found = graph.resolve(n) if isinstance(n, str) else ()
            if len(found) != 1 or graph.nodes[found[0]].op_type not in SPLITTABLE:
                continue
            nbytes = sum(graph.tensors[t].nbytes for t in graph.nodes[found[0]].input
                         if graph.is_weight(t))
            if nbytes > size:
                best, size = n, nbytes
    return best


def _share(mapping: dict, layer: str, key: str) -> dict:
    """``mapping`` with ``layer`` also under ``key`` (split equally by channels)."""
    out = {k: list(v) if isinstance(v, list) else v for k, v in mapping.items()}
    out.setdefault(key, [])
    if isinstance(out[key], list) and layer not in out[key]:
        out[key].append(layer)
    return out
