"""The fast path of the cost model: the arrays that make scoring a population cheap.

The model itself (what a stage, a round trip, a rank's memory and a board's energy are) is
specified in :mod:`autodice.dse.cost`; :class:`CostModel` computes the same numbers as
:func:`~autodice.dse.cost.plan_cost`, vectorised over candidates. Everything that depends only
on (model, platform, profile) -- layer x slot latencies, slot x slot links, tensor sizes and
uses, weight owners -- is precomputed here once; :mod:`autodice.dse.scoring` holds the steps that
score a population from them. A candidate is one resource (:class:`~autodice.dse.slots.Slot`)
per mapped layer.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..core.errors import Problems
from ..backend.wire import WIRE_SHARE
from ..core.model import Graph
from .cost import Cost, RankColumns, Scores, combine, report
from .scoring import (
    compute_and_params,
    holders,
    last_uses,
    live_peaks,
    ncnn_memory,
    population,
    round_trip_spans,
    transfers,
)
from .slots import candidate_slots
from .spans import layer_edges
from .timing import Timing


class CostModel:
    """Scores many mappings of one model on one platform fast.

    A candidate is an array of slot indices, one per mapped layer (``self.names`` order, which is
    topological). :meth:`evaluate` takes a (P, N) array of them.

    Raises:
        AutodiceError: the profile misses layers of the model.
    """

    def __init__(self, graph: Graph, timing: Timing, wire: str = "fp32"):
        self.graph, self.timing, self.wire = graph, timing, wire
        layer_nodes = [i for i in range(len(graph.nodes)) if i not in graph.followers]
        self.names = tuple(graph.names[i] for i in layer_nodes)
        self.n_layers = len(layer_nodes)
        self._check_profiles()
        self.position = np.full(len(graph.nodes), -1)  # node -> layer position, -1: follower
        self.position[layer_nodes] = np.arange(self.n_layers)
        self._slots_and_links()
        reach = self._follower_ranks()
        self._tensors_and_uses(layer_nodes, reach)
        self._weights(reach)
        self._ncnn_memory(layer_nodes)
        self.edge_src, self.edge_dst, self.edge_bytes = layer_edges(graph)

    # -- what depends only on (model, platform, profile), once

    def _check_profiles(self) -> None:
        """Every profile times every mapped layer (said once per profile, naming its hosts), so
        scoring never stops at a layer no profile knows."""
        timing, N = self.timing, self.n_layers
        problems = Problems()
        hosts_of: dict[int, list[str]] = {}
        for host, p in timing.profiles.items():
            hosts_of.setdefault(id(p), []).append(host)
        for hosts in hosts_of.values():
            missing = timing.missing_layers(hosts[0], self.names)
            if missing:
                problems.add(f"profile of {timing.profiles[hosts[0]].model} (hosts "
                             f"{', '.join(hosts)}): {len(missing)} of {N} layers of "
                             f'{self.graph.path} are not in it, e.g. "{missing[0]}"; profile '
                             f"this model")
        problems.raise_if_any()

    def _slots_and_links(self) -> None:
        """The candidate slots and what scoring looks up per slot: each layer's latency there
        (``time``, N x S) and, per slot pair, the link (seconds per byte, latency, whether it
        crosses hosts), so a transfer's time is two gathers."""
        timing = self.timing
        self.slots = candidate_slots(timing, self.names)
        with_gpu = {s.host for s in self.slots if s.gpu}
        untimed = [h for h, d in timing.platform.devices.items() if d.gpu and h not in with_gpu]
        self.notes = tuple(timing.notes) + ((
            f"GPUs of {', '.join(untimed)} left out: the profile has no GPU timings for them",)
            if untimed else ())
        S = self.n_slots = len(self.slots)
        self.cols = RankColumns(np.array([s.dev for s in self.slots]),
                                np.array([s.threads for s in self.slots]),
                                np.array([s.gpu for s in self.slots]))
        self.time = np.column_stack([timing.seconds(s.host, self.names,
                                                    None if s.gpu else s.threads, s.little,
                                                    s.int8)
                                     for s in self.slots])  # (N, S)
        self.sec_per_byte = np.zeros((S, S))
        self.latency = np.zeros((S, S))
        for a, sa in enumerate(self.slots):
            for b, sb in enumerate(self.slots):
                bw, lat = timing.links[sa.host, sb.host]
                self.sec_per_byte[a, b], self.latency[a, b] = 1.0 / bw, lat
        self.n_hosts = len(timing.platform.devices)
        host = self.cols.dev
        self.inter_host = host[:, None] != host[None, :]
        self.sec_per_byte[self.inter_host] *= WIRE_SHARE[self.wire]  # gen --wire

    def _follower_ranks(self) -> dict[int, frozenset[int]]:
        """Where followers run, as node -> layer positions whose ranks run it: on the ranks of
        the layers they feed (through follower chains), rank 0 (the rank of layer 0) when they
        feed nothing -- as place.assign_ranks does. Their reads and weights count there."""
        graph, followers = self.graph, self.graph.followers
        reach: dict[int, frozenset[int]] = {}
        for i in range(len(graph.nodes) - 1, -1, -1):
            if i not in followers:
                continue
            users: set[int] = set()
            for t in graph.nodes[i].output:
                for c in graph.consumers.get(t, ()):
                    users |= {int(self.position[c])} if c not in followers else reach[c]
            reach[i] = frozenset(users or {0})
        return reach

    def _tensors_and_uses(self, layer_nodes: list[int], reach: dict[int, frozenset[int]]) -> None:
        """Activation tensors (model inputs read by layers, then every layer output) and their
        uses by layers, in node order.

        A use is the *last* one on its rank unless a later use of the same tensor is on the same
        rank: precompute those pairs (``later_use``), so scoring needs no (tensor x rank) table.
        A follower reading a tensor (Shape of a static activation) frees nothing: if it comes
        after the last real use on that rank, the tensor is never freed there (the plan's memory
        walk does the same); ``follower_reads`` pairs such a use with the follower's layers.
        """
        graph, followers = self.graph, self.graph.followers
        tensors: list[tuple[str, int]] = [(t, -1) for t in graph.inputs
                                          if any(c not in followers
                                                 for c in graph.consumers.get(t, ()))]
        for p, i in enumerate(layer_nodes):
            tensors += [(t, p) for t in graph.nodes[i].output if t]
        self.n_tensors = len(tensors)
        types = graph.types
        self.tensor_names = [t for t, _ in tensors]
        self.producer = np.array([p for _, p in tensors])  # layer position; -1: a model input
        self.produced = self.producer >= 0
        self.produced_tensors = np.flatnonzero(self.produced)
        self.input_tensors = np.flatnonzero(~self.produced)
        self.nbytes = np.array([float(types[t].nbytes) if t in types else 0.0
                                for t, _ in tensors])
        self.is_static = np.array([t in types and types[t].static for t, _ in tensors])
        outputs = set(graph.outputs)
        self.is_output = np.array([t in outputs for t, _ in tensors])
        use_tensor, use_node, later, reads = [], [], [], []
        for k, (t, _) in enumerate(tensors):
            mine: list[int] = []
            readers = graph.consumers.get(t, ())
            for c in readers:
                if c not in followers and c not in {use_node[u] for u in mine}:
                    mine.append(len(use_tensor))
                    use_tensor.append(k)
                    use_node.append(c)
            later += [(u, v) for a, u in enumerate(mine) for v in mine[a + 1:]]
            reads += [(u, x) for c in readers if c in followers for x in sorted(reach[c])
                      for u in mine if use_node[u] < c]
        self.use_tensor = np.array(use_tensor, dtype=np.int64)
        self.use_pos = self.position[np.array(use_node, dtype=np.int64)]
        self.later_use = np.array(later, dtype=np.int64).reshape(-1, 2)  # (use, later use)
        self.follower_reads = np.array(reads, dtype=np.int64).reshape(-1, 2)  # (use, position)

    def _weights(self, reach: dict[int, frozenset[int]]) -> None:
        """A weight counts once on every rank that runs a node reading it: a weight with one
        reader's layer adds to that layer (``layer_params``), one shared by several layers is
        listed per layer (``shared_*``) and counted once per rank that holds any of them."""
        graph, followers = self.graph, self.graph.followers
        users: dict[str, set[int]] = {}
        for i, node in enumerate(graph.nodes):
            for t in node.input:
                if t and graph.is_weight(t):
                    users.setdefault(t, set()).update({int(self.position[i])}
                                                      if i not in followers else reach[i])
        self.layer_params = np.zeros(self.n_layers)
        shared_weight, shared_user, shared_bytes = [], [], []
        for w, us in users.items():
            nbytes = float(graph.tensors[w].nbytes)
            if len(us) == 1:
                self.layer_params[next(iter(us))] += nbytes
            else:
                for u in sorted(us):
                    shared_weight.append(len(shared_bytes))
                    shared_user.append(u)
                shared_bytes.append(nbytes)
        self.shared_weight = np.array(shared_weight, dtype=np.int64)
        self.shared_user = np.array(shared_user, dtype=np.int64)  # layer position
        self.shared_bytes = np.array(shared_bytes)

    def _ncnn_memory(self, layer_nodes: list[int]) -> None:
        """Each layer's bytes in ncnn on each slot's host, N x S: its weights repacked
        (``resident``), what it holds beyond them while loading (``loaded``: the file's copy,
        the repacking's scratch), its ``workspace``; what a CPU rank's memory is
        made of. GPU ranks count ONNX parameters (:func:`~autodice.dse.cost.combine`); their
        columns are never read."""
        onnx = [self.graph.weight_bytes(i) for i in layer_nodes]
        per_host = {(h, q): self.timing.memory_bytes(h, self.names, onnx, q)
                    for h, q in {(s.host, s.int8) for s in self.slots}}
        self.loaded, self.resident, self.workspace = (
            np.column_stack([per_host[s.host, s.int8][k] for s in self.slots])
            for k in range(3))

    # -- scoring

    def evaluate(self, slots: np.ndarray) -> Scores:
        """Score a (P, N) array of slot indices (one row per candidate mapping).

        The steps (:mod:`autodice.dse.scoring`) are the model of :mod:`autodice.dse.cost`, each
        over the whole population at once; :func:`~autodice.dse.cost.combine` then turns the
        per-rank figures into scores, as it does for :func:`~autodice.dse.cost.plan_cost`.
        """
        pop = population(self, slots)
        compute, params = compute_and_params(self, pop)
        resident, load_peak, workspace = ncnn_memory(self, pop)
        uses = last_uses(self, pop)
        holder = holders(self, pop, uses)
        cut = transfers(self, pop, uses, holder)
        peak = live_peaks(self, pop, uses, holder, cut)
        span = round_trip_spans(self, pop, compute, cut)
        scores = combine(self.timing, self.cols, pop.to_slots(compute), pop.to_slots(cut.comm),
                         pop.to_slots(span), cut.nic, pop.to_slots(params),
                         pop.to_slots(resident), pop.to_slots(load_peak),
                         pop.to_slots(workspace), pop.to_slots(peak),
                         pop.to_slots(cut.recv), pop.to_slots(cut.send), pop.used)
        return Scores(**{**scores.__dict__, "bad_cuts": cut.bad_cuts})

    # -- one candidate, for reports

    def order(self, slots: np.ndarray) -> list[int]:
        """Slots used by a candidate, in rank order (by first layer)."""
        g = np.asarray(slots)
        _, first = np.unique(g, return_index=True)
        return [int(g[k]) for k in sorted(first)]

    def precision(self, slots: np.ndarray) -> dict[str, str]:
        """The candidate's int8 keys, as ``gen --precision`` takes them (KEY -> "int8")."""
        return {self.slots[s].key: "int8" for s in self.order(slots) if self.slots[s].int8}

    def mapping(self, slots: np.ndarray) -> dict[str, list[str]]:
        """The candidate as mapping.json content (keys in rank order)."""
        g = np.asarray(slots)
        out: dict[str, list[str]] = {self.slots[s].key: [] for s in self.order(g)}
        for name, s in zip(self.names, g):
            out[self.slots[s].key].append(name)
        return out

    def cost(self, slots: np.ndarray) -> Cost:
        """The full report of one candidate."""
        g = np.asarray(slots)
        s = self.evaluate(g[None, :])
        counts = np.bincount(g, minlength=self.n_slots)
        return report(self.timing, s, 0, self.order(g), [x.key for x in self.slots],
                     [int(c) for c in counts], self.cols)

    def slots_of(self, mapping: Mapping[str, list[str]]) -> np.ndarray:
        """A mapping (keys among ``self.slots``) as a slot array.

        Raises:
            AutodiceError: a key that is not one of the candidate slots, a layer not mapped.
        """
        by_key = {s.key: k for k, s in enumerate(self.slots) if not s.int8}
        index = {n: k for k, n in enumerate(self.names)}
        g = np.full(self.n_layers, -1)
        problems = Problems()
        for key, layers in mapping.items():
            if key not in by_key:
                problems.add(f'mapping key "{key}" is not a resource the search uses '
                             f'({", ".join(by_key)})')
                continue
            for layer in layers:
                if layer in index:
                    g[index[layer]] = by_key[key]
        if (g < 0).any() and not problems:
            problems.add(f"{int((g < 0).sum())} layers are not mapped")
        problems.raise_if_any()
        return g
