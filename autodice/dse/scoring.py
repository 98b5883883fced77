"""The steps of :meth:`CostModel.evaluate <autodice.dse.cost_model.CostModel.evaluate>`: a
whole population of candidates scored at once.

Each step is one part of the model of :mod:`autodice.dse.cost` (compute and parameters per rank,
where each tensor is last used, the messages of cut tensors, peak live activations, round trips),
vectorised over the population: a handful of ``bincount``/``minimum.at`` calls over flat
(candidate, rank) indices, no Python loop over candidates. The steps read the arrays a
:class:`~autodice.dse.cost_model.CostModel` precomputed once per (model, platform, profile) and
pass the population's shared arrays along in :class:`Population`.

The steps name what they read as :class:`Tables`, a protocol the cost model meets, so this module
needs nothing from :mod:`autodice.dse.cost_model` (which imports it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .spans import frame_spans, has_round_trip

if TYPE_CHECKING:
    from .cost import RankColumns


class Tables(Protocol):
    """What the steps read of a :class:`~autodice.dse.cost_model.CostModel`: arrays it computed
    once per (model, platform, profile). Layers are positions in its topological order, tensors
    indices into its tensor table, slots indices into its candidate slots."""

    n_slots: int
    n_hosts: int
    n_tensors: int
    cols: RankColumns  # per slot: device index, threads, GPU or not
    time: np.ndarray  # (layers, slots) seconds
    sec_per_byte: np.ndarray  # (slots, slots)
    latency: np.ndarray  # (slots, slots) seconds
    inter_host: np.ndarray  # (slots, slots) bool: on different devices
    edge_src: np.ndarray  # layer edges (spans.layer_edges): from
    edge_dst: np.ndarray  # ... to
    edge_bytes: np.ndarray  # ... bytes
    producer: np.ndarray  # per tensor: producing layer, -1 for a model input
    produced: np.ndarray  # per tensor: bool
    produced_tensors: np.ndarray  # indices of produced tensors
    input_tensors: np.ndarray  # indices of model inputs
    is_output: np.ndarray  # per tensor: bool
    is_static: np.ndarray  # per tensor: bool, its type says static
    nbytes: np.ndarray  # per tensor: bytes
    use_tensor: np.ndarray  # per use (a tensor read by a layer): the tensor
    use_pos: np.ndarray  # ... the reading layer's position
    later_use: np.ndarray  # (use, later use of the same tensor) pairs
    follower_reads: np.ndarray  # (use, position) pairs: a follower on that layer's rank reads it
    layer_params: np.ndarray  # per layer: bytes of the weights only it reads
    shared_weight: np.ndarray  # per (shared weight, user) pair: the weight's index
    shared_user: np.ndarray  # ... the user's layer position
    shared_bytes: np.ndarray  # per shared weight: bytes
    loaded: np.ndarray  # (layers, slots) ncnn bytes held beyond resident while loading
    resident: np.ndarray  # ... weights repacked
    workspace: np.ndarray  # ... workspace


@dataclass(frozen=True)
class Population:
    """A population as ranks: what every scoring step of :meth:`CostModel.evaluate` shares.

    Each candidate numbers its own ranks 0..K-1 in slot order (K: the most ranks of any candidate
    of the population), so a per-rank figure of the whole population is one (P, K) array and one
    ``bincount`` over ``flat`` sums it. Columns become slots only for ``combine``.
    """

    slot: np.ndarray  # (P, N) slot of each layer
    rank: np.ndarray  # (P, N) the candidate's rank of each layer
    used: np.ndarray  # (P, S) bool: the slots a candidate uses
    rank_of_slot: np.ndarray  # (P, S) the rank of a used slot
    used_cand: np.ndarray  # (nnz,) with used_slot: np.nonzero(used)
    used_slot: np.ndarray  # (nnz,)
    slot_of_rank: np.ndarray  # (P, K)
    flat: np.ndarray  # (P * N,) candidate * K + rank of each layer: one index per (cand, rank)
    steps: np.ndarray  # (P * N,) flat (candidate, layer) indices laid out rank by rank, in order
    counts: np.ndarray  # (P * K,) layers of each (candidate, rank)
    offset: np.ndarray  # (P * K,) where each (candidate, rank) starts in ``steps``
    rows: np.ndarray  # (P, 1) candidate numbers, to index alongside (P, N) arrays
    layers: np.ndarray  # (N,) layer positions
    P: int
    N: int
    K: int

    def per_rank(self, weights) -> np.ndarray:
        """(P, K) sums over each rank's layers of ``weights`` ((N,) or (P, N))."""
        return np.bincount(self.flat, weights=np.broadcast_to(weights, (self.P, self.N)).ravel(),
                           minlength=self.P * self.K).reshape(self.P, self.K)

    def to_slots(self, x: np.ndarray) -> np.ndarray:
        """(P, K) or (P * K,) per rank -> (P, S) per slot, 0 on slots a candidate does not use."""
        out = np.zeros(self.used.shape)
        out[self.used_cand, self.used_slot] = x.reshape(self.P, self.K)[
            self.used_cand, self.rank_of_slot[self.used_cand, self.used_slot]]
        return out


@dataclass(frozen=True)
class LastUses:
    """(candidate, tensor, rank) entries where a rank uses a tensor for the last time: one per
    rank that needs the tensor, so these are also the receivers of cut tensors."""

    cand: np.ndarray
    tensor: np.ndarray
    rank: np.ndarray
    end: np.ndarray  # layer position of that last use; N where a follower keeps it to the end


@dataclass(frozen=True)
class Transfers:
    """The cut tensors (one entry per message, as the plan's edges count them) and their load."""

    is_recv: np.ndarray  # over the LastUses entries: a message to that rank
    cand: np.ndarray  # per message
    tensor: np.ndarray
    src: np.ndarray  # sending rank (the tensor's holder)
    dst: np.ndarray  # receiving rank
    comm: np.ndarray  # (P, K) seconds of transfers per rank, sent plus received
    recv: np.ndarray  # (P, K) bytes received
    send: np.ndarray  # (P, K) bytes sent
    nic: np.ndarray  # (P, 2H) egress then ingress seconds per host
    bad_cuts: np.ndarray  # (P,) cut tensors without a static shape


def population(cm: Tables, slots: np.ndarray) -> Population:
    """Each candidate's own ranks 0..K-1, in slot order: the report reorders them by first
    layer (:meth:`~autodice.dse.cost_model.CostModel.order`); scoring needs only that each used
    slot is one rank."""
    slot = np.asarray(slots, dtype=np.int64)
    if slot.ndim == 1:
        slot = slot[None, :]
    P, N = slot.shape
    rows = np.arange(P)[:, None]
    used = np.zeros((P, cm.n_slots), dtype=bool)
    used[rows, slot] = True
    rank_of_slot = np.cumsum(used, axis=1) - 1
    K = int(rank_of_slot[:, -1].max()) + 1
    rank = rank_of_slot[rows, slot]
    used_cand, used_slot = np.nonzero(used)
    slot_of_rank = np.zeros((P, K), dtype=np.int64)
    slot_of_rank[used_cand, rank_of_slot[used_cand, used_slot]] = used_slot
    flat = (rows * K + rank).ravel()
    # a stable sort by rank keeps each rank's layers in order
    steps = np.argsort(flat.astype(np.int16 if P * K < 2**15 else np.int64), kind="stable")
    counts = np.bincount(flat, minlength=P * K)
    return Population(slot, rank, used, rank_of_slot, used_cand, used_slot, slot_of_rank, flat,
                      steps, counts, np.cumsum(counts) - counts, rows, np.arange(N), P, N, K)


def ncnn_memory(cm: Tables, pop: Population) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(P * K,) each rank's weights as ncnn holds them, the most its weights take while it
    loads (:func:`~autodice.dse.cost.weights_peak`: one cumulative sum over the ranks' steps),
    and the largest workspace of its layers."""
    at = (pop.layers, pop.slot)
    kept = cm.resident[at].ravel()[pop.steps]
    total = np.cumsum(kept)
    full = pop.counts > 0
    start = pop.offset[full]
    before = np.repeat(total[start] - kept[start], pop.counts[full])  # the earlier ranks'
    loading = total - before + cm.loaded[at].ravel()[pop.steps]
    peak, workspace = np.zeros(pop.P * pop.K), np.zeros(pop.P * pop.K)
    peak[full] = np.maximum.reduceat(loading, start)
    workspace[full] = np.maximum.reduceat(cm.workspace[at].ravel()[pop.steps], start)
    return pop.per_rank(cm.resident[at]).ravel(), peak, workspace


def compute_and_params(cm: Tables, pop: Population) -> tuple[np.ndarray, np.ndarray]:
    """(P, K) compute seconds and parameter bytes per rank. A weight shared by layers on one
    rank is held once: mark which ranks hold each shared weight, then sum each once."""
    P, K = pop.P, pop.K
    compute = pop.per_rank(cm.time[pop.layers, pop.slot])
    params = pop.per_rank(cm.layer_params)
    if cm.shared_weight.size:
        W = len(cm.shared_bytes)
        present = np.zeros(P * W * K, dtype=bool)
        holds = ((pop.rows * W + cm.shared_weight) * K + pop.rank[:, cm.shared_user]).ravel()
        present[holds] = True
        params += np.einsum("pwk,w->pk", present.reshape(P, W, K), cm.shared_bytes)
    return compute, params


def last_uses(cm: Tables, pop: Population) -> LastUses:
    """Entries (candidate, use) where the use is the last one of its tensor on its rank: a
    rank frees a tensor there, and a rank that uses a tensor it does not hold receives it."""
    P, N, U = pop.P, pop.N, len(cm.use_tensor)
    use_rank = pop.rank[:, cm.use_pos]  # (P, U)
    not_last = np.zeros(P * U, dtype=bool)
    if cm.later_use.size:
        same = use_rank[:, cm.later_use[:, 0]] == use_rank[:, cm.later_use[:, 1]]
        not_last = np.bincount((pop.rows * U + cm.later_use[:, 0]).ravel(),
                               weights=same.ravel(), minlength=P * U) > 0
    cand, use = np.nonzero(~not_last.reshape(P, U))
    end = cm.use_pos[use]
    if cm.follower_reads.size:
        late = use_rank[:, cm.follower_reads[:, 0]] == pop.rank[:, cm.follower_reads[:, 1]]
        never = np.bincount((pop.rows * U + cm.follower_reads[:, 0]).ravel(),
                            weights=late.ravel(), minlength=P * U) > 0
        end = np.where(never[cand * U + use], N, end)
    return LastUses(cand, cm.use_tensor[use], use_rank[cand, use], end)


def holders(cm: Tables, pop: Population, uses: LastUses) -> np.ndarray:
    """(P, T) the rank that holds each tensor first: its producer's, or for a model input
    the consumer rank that comes first in rank order (ranks are ordered by first layer), as
    the plan makes that rank read the input and send it on."""
    P, N, K, T = pop.P, pop.N, pop.K, cm.n_tensors
    holder = np.zeros((P, T), dtype=np.int64)
    holder[:, cm.produced] = pop.rank[:, cm.producer[cm.produced]]
    if cm.input_tensors.size:
        first = np.full(P * K, N, dtype=np.int64)  # first layer of each rank
        np.minimum.at(first, pop.flat, np.broadcast_to(pop.layers, (P, N)).ravel())
        inp = ~cm.produced[uses.tensor]
        cand, tensor, rank = uses.cand[inp], uses.tensor[inp], uses.rank[inp]
        best = np.full(P * T, (N + 1) * K, dtype=np.int64)
        np.minimum.at(best, cand * T + tensor, first[cand * K + rank] * K + rank)
        best = best.reshape(P, T)[:, cm.input_tensors]
        holder[:, cm.input_tensors] = np.where(best < (N + 1) * K, best % K, 0)
    return holder


def transfers(cm: Tables, pop: Population, uses: LastUses, holder: np.ndarray) -> Transfers:
    """A last use on a rank other than the tensor's holder is a message from the holder. It
    occupies both ends for its transfer time; between hosts, also the sender's NIC egress
    and the receiver's ingress. A cut tensor without a static shape breaks a constraint."""
    P, K, H = pop.P, pop.K, cm.n_hosts
    is_recv = uses.rank != holder[uses.cand, uses.tensor]
    cand, tensor, dst = uses.cand[is_recv], uses.tensor[is_recv], uses.rank[is_recv]
    src = holder[cand, tensor]
    a, b = pop.slot_of_rank[cand, src], pop.slot_of_rank[cand, dst]
    nbytes = cm.nbytes[tensor]
    xfer = nbytes * cm.sec_per_byte[a, b] + cm.latency[a, b]
    at_dst, at_src = cand * K + dst, cand * K + src
    comm = (np.bincount(at_dst, weights=xfer, minlength=P * K)
            + np.bincount(at_src, weights=xfer, minlength=P * K)).reshape(P, K)
    recv = np.bincount(at_dst, weights=nbytes, minlength=P * K).reshape(P, K)
    send = np.bincount(at_src, weights=nbytes, minlength=P * K).reshape(P, K)
    cross = cm.inter_host[a, b]
    host = cm.cols.dev
    nic = (np.bincount(cand[cross] * 2 * H + host[a[cross]], weights=xfer[cross],
                       minlength=P * 2 * H)
           + np.bincount(cand[cross] * 2 * H + H + host[b[cross]], weights=xfer[cross],
                         minlength=P * 2 * H)).reshape(P, 2 * H)
    bad_cuts = np.bincount(cand, weights=~cm.is_static[tensor], minlength=P).astype(int)
    return Transfers(is_recv, cand, tensor, src, dst, comm, recv, send, nic, bad_cuts)


def live_peaks(cm: Tables, pop: Population, uses: LastUses, holder: np.ndarray,
               cut: Transfers) -> np.ndarray:
    """(P * K,) peak live activation bytes per rank, as the plan's memory walk finds them.

    Every candidate's steps are laid out rank by rank (``pop.steps``); a tensor held by a rank
    is live over a run of that rank's steps, so one cumulative sum over P x N gives every rank's
    live bytes at every step.
    """
    P, N, K = pop.P, pop.N, pop.K
    counts, offset = pop.counts, pop.offset  # each rank's steps, its first one
    step = np.empty(P * N, dtype=np.int64)  # (candidate, layer) -> its step
    step[pop.steps] = np.arange(P * N)
    last_step = offset + counts - 1

    def step_or_last(cand, rank, position):
        return np.where(position < N, step[cand * N + np.minimum(position, N - 1)],
                        last_step[cand * K + rank])

    # receivers and the owner of a model input: from the rank's first step to the last use
    held = cut.is_recv | ~cm.produced[uses.tensor]
    h_cand, h_rank, h_tensor = uses.cand[held], uses.rank[held], uses.tensor[held]
    h_lo = offset[h_cand * K + h_rank]
    h_hi = step_or_last(h_cand, h_rank, uses.end[held])
    # producers: from the producing step; held to the end when sent or a model output
    kept = np.zeros((P, cm.n_tensors), dtype=bool)
    kept[cut.cand, cut.tensor] = True
    kept |= cm.is_output[None, :]
    local_end = np.full((P, cm.n_tensors), N, dtype=np.int64)
    local = ~held
    local_end[uses.cand[local], uses.tensor[local]] = uses.end[local]
    produced = cm.produced_tensors
    p_end = np.where(kept[:, produced], N, local_end[:, produced]).ravel()
    p_cand = np.repeat(np.arange(P), produced.size)
    p_rank = holder[:, produced].ravel()
    p_lo = step[p_cand * N + np.tile(cm.producer[produced], P)]
    p_hi = step_or_last(p_cand, p_rank, p_end)
    lo = np.concatenate([h_lo, p_lo])
    hi = np.concatenate([h_hi, p_hi])
    w = np.concatenate([cm.nbytes[h_tensor], np.tile(cm.nbytes[produced], P)])
    live = np.cumsum(np.bincount(lo, weights=w, minlength=P * N + 1)
                     - np.bincount(hi + 1, weights=w, minlength=P * N + 1))[:P * N]
    peak = np.zeros(P * K)
    full = counts > 0
    peak[full] = np.maximum.reduceat(live, offset[full])
    return peak


def round_trip_spans(cm: Tables, pop: Population, compute: np.ndarray,
                     cut: Transfers) -> np.ndarray:
    """(P, K) first-to-last-layer time of one frame per rank. Only candidates whose rank
    graph has a cycle can wait for a round trip, and only they pay for the longest paths;
    for the others the span is the compute."""
    span = compute.copy()
    adjacency = np.zeros((pop.P, pop.K, pop.K))
    adjacency[cut.cand, cut.src, cut.dst] = 1.0
    cyclic = np.flatnonzero(has_round_trip(adjacency))
    if cyclic.size:
        slot, rank = pop.slot[cyclic], pop.rank[cyclic]
        sa, sb = slot[:, cm.edge_src], slot[:, cm.edge_dst]
        w = np.where(rank[:, cm.edge_src] == rank[:, cm.edge_dst], 0.0,
                     cm.edge_bytes * cm.sec_per_byte[sa, sb] + cm.latency[sa, sb])
        span[cyclic] = frame_spans(rank, cm.time[pop.layers, slot], cm.edge_src, cm.edge_dst, w,
                                   pop.K)
    return span
