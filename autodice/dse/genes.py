"""How the search encodes a mapping as genes, both encodings, and how genes become mappings.

* ``layer`` (the paper's): one gene per mapped layer, its resource among {one core, all cores,
  GPU} of each device (of each kind of core, on a board with big and little ones). Decoding
  repairs overlaps: a device whose "one core" and "all cores" are both used gets two disjoint
  ranks, its first core and the others.
* ``segment``: the layers in topological order cut into at most K contiguous runs; genes are the
  K-1 cut positions and each run's resource. A smaller space of pipeline-shaped mappings.

Where the profile timed layers in int8, one more gene per group of cores (a device's, or one
kind of them) says whether its keys compute in int8: 0 fp32, 1 int8. It comes after the
mapping's genes in either encoding, and decoding moves the group's slots to their int8 twins.

A decoded candidate is a row of slot indices, what :class:`~autodice.dse.cost_model.CostModel`
scores.
"""

from __future__ import annotations

import numpy as np

from .cost_model import CostModel

ENCODINGS = ("layer", "segment")


class Genes:
    """Genes <-> slot arrays (the columns of :class:`~autodice.dse.cost_model.CostModel`), in
    either encoding."""

    def __init__(self, cm: CostModel, encoding: str = "layer", segments: int | None = None):
        self.cm, self.encoding = cm, encoding
        slots = cm.slots
        # The alphabet: the paper's one core / all cores / GPU per device ("rest" is a repair).
        self.alpha = np.array([k for k, s in enumerate(slots) if s.kind != "rest" and not s.int8])
        self.n_alpha = len(self.alpha)
        S = len(slots)
        self.rest_of = np.arange(S)  # slot -> the slot it becomes when its group's first core
        #                              is taken
        self.one_of = np.arange(S)  # slot -> the "one core" slot of its group
        self.is_all = np.zeros(S, dtype=bool)
        for k, s in enumerate(slots):  # a group: a device's cores, or one kind of them
            self.one_of[k] = next(j for j, x in enumerate(slots) if x.group == s.group
                                  and x.kind == "one")
            if s.kind == "all":
                self.is_all[k] = True
                self.rest_of[k] = next(j for j, x in enumerate(slots) if x.group == s.group
                                       and x.kind == "rest")
        N = cm.n_layers
        if encoding == "layer":
            self.n_var = N
            self.xl, self.xu = np.zeros(N, dtype=int), np.full(N, self.n_alpha - 1)
        else:
            self.k = min(segments or min(self.n_alpha, 16), N)
            self.n_var = 2 * self.k - 1
            self.xl = np.zeros(self.n_var, dtype=int)
            self.xu = np.concatenate([np.full(self.k - 1, N), np.full(self.k, self.n_alpha - 1)])
        # int8: slot -> its twin, and -> its group's precision gene (-1: none)
        twin = {(s.key, s.kind, s.group): k for k, s in enumerate(slots) if s.int8}
        self.int8_of = np.array([twin.get((s.key, s.kind, s.group), k) if not s.int8 else k
                                 for k, s in enumerate(slots)])
        groups = sorted({slots[k].group for k in range(S) if self.int8_of[k] != k})
        self.precision_gene = np.array([groups.index(s.group) if self.int8_of[k] != k else -1
                                        for k, s in enumerate(slots)])
        self.n_map, self.n_precision = self.n_var, len(groups)
        self.n_var += self.n_precision
        self.xl = np.concatenate([self.xl, np.zeros(self.n_precision, dtype=int)])
        self.xu = np.concatenate([self.xu, np.ones(self.n_precision, dtype=int)])

    def layer_genes(self, X: np.ndarray) -> np.ndarray:
        """Alphabet index per layer (the segment encoding expanded)."""
        X = np.asarray(X, dtype=np.int64)[:, :self.n_map]
        if self.encoding == "layer":
            return X
        k = self.k
        cuts = np.sort(X[:, :k - 1], axis=1)
        seg = (np.arange(self.cm.n_layers)[None, :, None] >= cuts[:, None, :]).sum(axis=2)
        return np.take_along_axis(X[:, k - 1:], seg, axis=1)

    def decode(self, X: np.ndarray) -> np.ndarray:
        """(P, n_var) genes -> (P, N) slot indices, overlapping cores repaired, the slots of
        groups whose precision gene is 1 moved to their int8 twins."""
        X = np.atleast_2d(np.asarray(X, dtype=np.int64))
        slots = self.alpha[self.layer_genes(X)]
        P = len(slots)
        present = np.zeros((P, self.cm.n_slots), dtype=bool)
        present[np.arange(P)[:, None], slots] = True
        clash = self.is_all[slots] & present[np.arange(P)[:, None], self.one_of[slots]]
        slots = np.where(clash, self.rest_of[slots], slots)
        if not self.n_precision:
            return slots
        gene = self.precision_gene[slots]
        on = (gene >= 0) & (np.take_along_axis(X[:, self.n_map:], np.maximum(gene, 0), 1) == 1)
        return np.where(on, self.int8_of[slots], slots)

    def encode_layers(self, genes: np.ndarray, precision=None) -> np.ndarray:
        """Alphabet indices per layer (and the precision genes: all fp32 by default) -> this
        encoding's genes (runs become segments; more runs than K are merged into the last
        segment)."""
        genes = np.asarray(genes)
        tail = np.zeros(self.n_precision, dtype=int) if precision is None else precision
        if self.encoding == "layer":
            return np.concatenate([genes, tail]).astype(genes.dtype)
        starts = [0] + [p for p in range(1, len(genes)) if genes[p] != genes[p - 1]]
        starts = starts[:self.k]
        cuts = starts[1:] + [self.cm.n_layers] * (self.k - len(starts))
        res = [genes[p] for p in starts] + [genes[starts[-1]]] * (self.k - len(starts))
        return np.array(cuts + res + list(tail))


def balanced_cuts(times: np.ndarray, n_segments: int) -> np.ndarray:
    """Start positions of ``n_segments`` contiguous runs whose times (column j for run j) are
    as even as possible: binary search on the period, greedy fill."""
    N = times.shape[0]
    cum = np.vstack([np.zeros(n_segments), np.cumsum(times, axis=0)])  # (N+1, k)

    def fill(period):
        starts, b = [], 0
        for j in range(n_segments):
            starts.append(min(b, N))
            if j + 1 == n_segments:
                return starts, cum[N, j] - cum[min(b, N), j] <= period
            if b < N:
                e = int(np.searchsorted(cum[:, j], cum[b, j] + period, side="right")) - 1
                b = max(e, b + 1)

    lo, hi = 0.0, float(cum[-1].max())
    for _ in range(40):
        mid = (lo + hi) / 2
        if fill(mid)[1]:
            hi = mid
        else:
            lo = mid
    return np.array(fill(hi)[0])
