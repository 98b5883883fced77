"""The fast path of the cost model: a whole population of mappings scored at once.

The model itself (what a stage, a round trip, a rank's memory and a board's energy are) is
specified in :mod:`autodice.dse.cost`; this module computes the same numbers as
:func:`~autodice.dse.cost.plan_cost`, vectorised over candidates, from arrays precomputed once per
(model, platform, profile). A candidate is one resource (:class:`Slot`) per mapped layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..core.errors import Problems
from ..core.model import Graph
from ..core.spec import parse_key
from .cost import Cost, RankColumns, Scores, combine, report
from .spans import frame_spans, has_round_trip, layer_edges
from .timing import Timing

KINDS = ("one", "all", "rest", "gpu")


@dataclass(frozen=True)
class Slot:
    """A resource a layer can be given: one of a device's cores, all of them, all but the first
    (when another rank has the first), or its GPU."""

    key: str
    host: str
    dev: int
    kind: str  # one of KINDS
    cores: tuple[int, ...]
    threads: int  # CPU threads (1 for the GPU)
    gpu: bool


def cpu_key(host: str, family: str, cores: tuple[int, ...]) -> str:
    """A mapping key for ``cores``: the paper's one digit per core when possible, else ranges."""
    if all(c < 10 for c in cores):
        key = f"{host}_{family}{''.join(map(str, cores))}"
    else:
        parts, start = [], None
        for k, c in enumerate(cores):
            start = c if start is None else start
            if k + 1 == len(cores) or cores[k + 1] != c + 1:
                parts.append(f"{start}-{c}")
                start = None
        key = f"{host}_{family}{','.join(parts)}"
    assert parse_key(key).cores == tuple(cores), key
    return key


def candidate_slots(timing: Timing, names) -> tuple[Slot, ...]:
    """Every resource of every device (``rest`` only where a device has 2+ cores, ``gpu`` only
    where the platform has one and the profile timed it)."""
    slots = []
    for d, (host, dev) in enumerate(timing.platform.devices.items()):
        cores = dev.slots
        slots.append(Slot(cpu_key(host, dev.arch, cores[:1]), host, d, "one", cores[:1], 1, False))
        if len(cores) > 1:
            slots.append(Slot(cpu_key(host, dev.arch, cores), host, d, "all", cores, len(cores),
                              False))
            slots.append(Slot(cpu_key(host, dev.arch, cores[1:]), host, d, "rest", cores[1:],
                              len(cores) - 1, False))
        if dev.gpu is not None and timing.has_gpu_timings(host, names):
            slots.append(Slot(f"{host}_gpu", host, d, "gpu", (), 1, True))
    return tuple(slots)


class CostModel:
    """Scores many mappings of one model on one platform fast.

    A candidate is an array of slot indices, one per mapped layer (``self.names`` order, which is
    topological). :meth:`evaluate` takes a (P, N) array of them.

    Raises:
        AutodiceError: the profile misses layers of the model.
    """

    def __init__(self, graph: Graph, timing: Timing):
        self.graph, self.timing = graph, timing
        followers = graph.followers
        layer_nodes = [i for i in range(len(graph.nodes)) if i not in followers]
        self.names = tuple(graph.names[i] for i in layer_nodes)
        N = self.n_layers = len(layer_nodes)
        problems = Problems()
        hosts_of: dict[int, list[str]] = {}
        for host, p in timing.profiles.items():
            hosts_of.setdefault(id(p), []).append(host)
        for hosts in hosts_of.values():
            missing = timing.missing_layers(hosts[0], self.names)
            if missing:
                problems.add(f"profile of {timing.profiles[hosts[0]].model} (hosts "
                             f"{', '.join(hosts)}): {len(missing)} of {N} layers of {graph.path} "
                             f'are not in it, e.g. "{missing[0]}"; profile this model')
        problems.raise_if_any()
        pos = np.full(len(graph.nodes), -1)
        pos[layer_nodes] = np.arange(N)
        self.pos = pos
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
                                                    None if s.gpu else s.threads)
                                     for s in self.slots])  # (N, S)
        hosts = list(timing.platform.devices)
        self.inv_bw = np.zeros((S, S))
        self.lat = np.zeros((S, S))
        for a, sa in enumerate(self.slots):
            for b, sb in enumerate(self.slots):
                bw, lat = timing.links[sa.host, sb.host]
                self.inv_bw[a, b], self.lat[a, b] = 1.0 / bw, lat
        self.n_hosts = len(hosts)

        # Where followers run: on the ranks of the layers they feed (through follower chains),
        # rank 0 (the rank of layer 0) when they feed nothing -- as place.assign_ranks does.
        reach: dict[int, frozenset[int]] = {}
        for i in range(len(graph.nodes) - 1, -1, -1):
            if i not in followers:
                continue
            users: set[int] = set()
            for t in graph.nodes[i].output:
                for c in graph.consumers.get(t, ()):
                    users |= {int(pos[c])} if c not in followers else reach[c]
            reach[i] = frozenset(users or {0})

        # Activation tensors: model inputs read by layers, then every layer output.
        tensors: list[tuple[str, int]] = [(t, -1) for t in graph.inputs
                                          if any(c not in followers
                                                 for c in graph.consumers.get(t, ()))]
        for p, i in enumerate(layer_nodes):
            tensors += [(t, p) for t in graph.nodes[i].output if t]
        self.n_tensors = len(tensors)
        types = graph.types
        self.tensor_names = [t for t, _ in tensors]
        self.prod = np.array([p for _, p in tensors])
        self.size = np.array([float(types[t].nbytes) if t in types else 0.0 for t, _ in tensors])
        self.static = np.array([t in types and types[t].static for t, _ in tensors])
        outputs = set(graph.outputs)
        self.is_output = np.array([t in outputs for t, _ in tensors])
        self.inputs = np.flatnonzero(self.prod < 0)
        # Uses of each tensor by layers, in node order. A use is the *last* one on its rank
        # unless a later use of the same tensor is on the same rank: precompute those pairs, so
        # scoring needs no (tensor x rank) table. A follower reading a tensor (Shape of a static
        # activation) frees nothing: if it comes after the last real use on that rank, the
        # tensor is never freed there (the plan's memory walk does the same).
        use_t, use_node, later, phantom = [], [], [], []
        for k, (t, _) in enumerate(tensors):
            mine: list[int] = []
            readers = graph.consumers.get(t, ())
            for c in readers:
                if c not in followers and c not in {use_node[u] for u in mine}:
                    mine.append(len(use_t))
                    use_t.append(k)
                    use_node.append(c)
            later += [(u, v) for a, u in enumerate(mine) for v in mine[a + 1:]]
            phantom += [(u, x) for c in readers if c in followers for x in sorted(reach[c])
                        for u in mine if use_node[u] < c]
        self.use_t, self.use_node = np.array(use_t, dtype=np.int64), np.array(use_node)
        self.use_pos = pos[self.use_node]
        self.later = np.array(later, dtype=np.int64).reshape(-1, 2)
        self.phantom = np.array(phantom, dtype=np.int64).reshape(-1, 2)  # (use, position)

        # Weights: a weight counts once on every rank that runs a node reading it.
        users: dict[str, set[int]] = {}
        for i, node in enumerate(graph.nodes):
            for t in node.input:
                if t and graph.is_weight(t):
                    users.setdefault(t, set()).update({int(pos[i])} if i not in followers
                                                      else reach[i])
        self.layer_params = np.zeros(N)
        shared_w, shared_pos = [], []
        self.shared_size = []
        for w, us in users.items():
            nbytes = float(graph.tensors[w].nbytes)
            if len(us) == 1:
                self.layer_params[next(iter(us))] += nbytes
            else:
                for u in sorted(us):
                    shared_w.append(len(self.shared_size))
                    shared_pos.append(u)
                self.shared_size.append(nbytes)
        self.shared_w, self.shared_pos = np.array(shared_w, dtype=np.int64), np.array(shared_pos,
                                                                                        dtype=np.int64)
        self.shared_size = np.array(self.shared_size)
        host_of = self.cols.dev
        self.cross = host_of[:, None] != host_of[None, :]
        self.edge_src, self.edge_dst, self.edge_bytes = layer_edges(graph)

    # -- scoring

    def evaluate(self, slots: np.ndarray) -> Scores:
        """Score a (P, N) array of slot indices (one row per candidate mapping)."""
        g = np.asarray(slots, dtype=np.int64)
        if g.ndim == 1:
            g = g[None, :]
        P, N = g.shape
        S, T, H, U = self.n_slots, self.n_tensors, self.n_hosts, len(self.use_t)
        rows = np.arange(P)[:, None]
        steps = np.arange(N)
        # Each candidate's own ranks 0..K-1 (K = most ranks in the population), in slot order.
        used = np.zeros((P, S), dtype=bool)
        used[rows, g] = True
        local = np.cumsum(used, axis=1) - 1
        K = int(local[:, -1].max()) + 1
        lg = local[rows, g]  # (P, N) rank of each layer
        ui, us = np.nonzero(used)
        slot_of = np.zeros((P, K), dtype=np.int64)
        slot_of[ui, local[ui, us]] = us
        flat = (rows * K + lg).ravel()

        def per_rank(weights):
            return np.bincount(flat, weights=np.broadcast_to(weights, (P, N)).ravel(),
                               minlength=P * K).reshape(P, K)

        compute = per_rank(self.time[steps, g])
        params = per_rank(self.layer_params)
        if self.shared_w.size:
            W = len(self.shared_size)
            present = np.zeros(P * W * K, dtype=bool)
            present[((rows * W + self.shared_w) * K + lg[:, self.shared_pos]).ravel()] = True
            params += np.einsum("pwk,w->pk", present.reshape(P, W, K), self.shared_size)

        # Entries: (candidate, use) where the use is the last one of its tensor on its rank.
        ru = lg[:, self.use_pos]  # (P, U)
        not_last = np.zeros(P * U, dtype=bool)
        if self.later.size:
            same = ru[:, self.later[:, 0]] == ru[:, self.later[:, 1]]
            not_last = np.bincount((rows * U + self.later[:, 0]).ravel(), weights=same.ravel(),
                                   minlength=P * U) > 0
        ei, eu = np.nonzero(~not_last.reshape(P, U))
        et, ek = self.use_t[eu], ru[ei, eu]
        end = self.pos[self.use_node[eu]]  # layer position of the last local use
        if self.phantom.size:
            late = ru[:, self.phantom[:, 0]] == lg[:, self.phantom[:, 1]]
            never = np.bincount((rows * U + self.phantom[:, 0]).ravel(), weights=late.ravel(),
                                minlength=P * U) > 0
            end = np.where(never[ei * U + eu], N, end)

        # The rank that holds each tensor first: its producer's, or for a model input the
        # consumer rank that comes first in rank order (ranks are ordered by first layer).
        src = np.zeros((P, T), dtype=np.int64)
        act = self.prod >= 0
        src[:, act] = lg[:, self.prod[act]]
        if self.inputs.size:
            first = np.full(P * K, N, dtype=np.int64)
            np.minimum.at(first, flat, np.broadcast_to(steps, (P, N)).ravel())
            inp = ~act[et]
            best = np.full(P * T, (N + 1) * K, dtype=np.int64)
            np.minimum.at(best, ei[inp] * T + et[inp],
                          first[ei[inp] * K + ek[inp]] * K + ek[inp])
            best = best.reshape(P, T)[:, self.inputs]
            src[:, self.inputs] = np.where(best < (N + 1) * K, best % K, 0)
        is_recv = ek != src[ei, et]
        ri, rt, rk = ei[is_recv], et[is_recv], ek[is_recv]
        rsrc = src[ri, rt]
        a, b = slot_of[ri, rsrc], slot_of[ri, rk]
        nbytes = self.size[rt]
        xfer = nbytes * self.inv_bw[a, b] + self.lat[a, b]
        at_dst, at_src = ri * K + rk, ri * K + rsrc
        comm = (np.bincount(at_dst, weights=xfer, minlength=P * K)
                + np.bincount(at_src, weights=xfer, minlength=P * K)).reshape(P, K)
        recv = np.bincount(at_dst, weights=nbytes, minlength=P * K).reshape(P, K)
        send = np.bincount(at_src, weights=nbytes, minlength=P * K).reshape(P, K)
        cross = self.cross[a, b]
        host = self.cols.dev
        nic = (np.bincount(ri[cross] * 2 * H + host[a[cross]], weights=xfer[cross],
                           minlength=P * 2 * H)
               + np.bincount(ri[cross] * 2 * H + H + host[b[cross]], weights=xfer[cross],
                             minlength=P * 2 * H)).reshape(P, 2 * H)
        bad_cuts = np.bincount(ri, weights=~self.static[rt], minlength=P).astype(int)

        # Peak live activations. Lay every candidate's steps out rank by rank (a stable sort by
        # rank keeps each rank's layers in order); a tensor held by a rank is live over a run of
        # that rank's steps, so one cumulative sum over P x N gives every rank's live bytes.
        counts = np.bincount(flat, minlength=P * K)
        offset = np.cumsum(counts) - counts
        order = np.argsort(flat.astype(np.int16 if P * K < 2**15 else np.int64), kind="stable")
        at = np.empty(P * N, dtype=np.int64)
        at[order] = np.arange(P * N)
        last_step = offset + counts - 1

        def step_or_last(i, k, p):
            return np.where(p < N, at[i * N + np.minimum(p, N - 1)], last_step[i * K + k])

        # receivers and the owner of a model input: from the rank's first step to the last use
        hold = is_recv | ~act[et]
        hi_, hk, ht = ei[hold], ek[hold], et[hold]
        h_lo = offset[hi_ * K + hk]
        h_hi = step_or_last(hi_, hk, end[hold])
        # producers: from the producing step; held to the end when sent or a model output
        kept = np.zeros((P, T), dtype=bool)
        kept[ri, rt] = True
        kept |= self.is_output[None, :]
        local_end = np.full((P, T), N, dtype=np.int64)
        here = ~hold
        local_end[ei[here], et[here]] = end[here]
        ta = np.flatnonzero(act)
        p_end = np.where(kept[:, ta], N, local_end[:, ta]).ravel()
        pi = np.repeat(np.arange(P), ta.size)
        pk = src[:, ta].ravel()
        p_lo = at[pi * N + np.tile(self.prod[ta], P)]
        p_hi = step_or_last(pi, pk, p_end)
        lo = np.concatenate([h_lo, p_lo])
        hi = np.concatenate([h_hi, p_hi])
        w = np.concatenate([self.size[ht], np.tile(self.size[ta], P)])
        live = np.cumsum(np.bincount(lo, weights=w, minlength=P * N + 1)
                         - np.bincount(hi + 1, weights=w, minlength=P * N + 1))[:P * N]
        peak = np.zeros(P * K)
        full = counts > 0
        peak[full] = np.maximum.reduceat(live, offset[full])

        def to_slots(x):
            out = np.zeros((P, S))
            out[ui, us] = x.reshape(P, K)[ui, local[ui, us]]
            return out

        # Round trips: only candidates whose rank graph has a cycle need the longest paths.
        span = compute.copy()
        adjacency = np.zeros((P, K, K))
        adjacency[ri, rsrc, rk] = 1.0
        cyc = np.flatnonzero(has_round_trip(adjacency))
        if cyc.size:
            gc, lc = g[cyc], lg[cyc]
            sa, sb = gc[:, self.edge_src], gc[:, self.edge_dst]
            w = np.where(lc[:, self.edge_src] == lc[:, self.edge_dst], 0.0,
                         self.edge_bytes * self.inv_bw[sa, sb] + self.lat[sa, sb])
            span[cyc] = frame_spans(lc, self.time[steps, gc], self.edge_src, self.edge_dst, w, K)

        scores = combine(self.timing, self.cols, to_slots(compute), to_slots(comm),
                          to_slots(span), nic, to_slots(params), to_slots(peak), to_slots(recv),
                          to_slots(send), used)
        return Scores(**{**scores.__dict__, "bad_cuts": bad_cuts})

    # -- one candidate, for reports

    def order(self, slots: np.ndarray) -> list[int]:
        """Slots used by a candidate, in rank order (by first layer)."""
        g = np.asarray(slots)
        _, first = np.unique(g, return_index=True)
        return [int(g[k]) for k in sorted(first)]

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
        by_key = {s.key: k for k, s in enumerate(self.slots)}
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
