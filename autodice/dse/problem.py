"""The search in pymoo's shape: the mapping problem, its operators, and one NSGA-II run.

:class:`MappingProblem` fills pymoo's ``F`` and ``G`` from the cost model; the operators keep
mappings pipeline-shaped (a random gene per layer makes every layer boundary a transfer). This
module imports pymoo at its top, and :mod:`autodice.dse.search` imports it only when a search
runs, so the CLI and the rest of the package load without pymoo.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..core.errors import AutodiceError
from .genes import Genes, balanced_cuts

try:
    from pymoo.algorithms.moo.nsga2 import NSGA2
    from pymoo.core.callback import Callback
    from pymoo.core.duplicate import DuplicateElimination
    from pymoo.core.mutation import Mutation
    from pymoo.core.problem import Problem
    from pymoo.core.repair import Repair
    from pymoo.core.sampling import Sampling
    from pymoo.core.variable import get
    from pymoo.operators.crossover.pntx import TwoPointCrossover
    from pymoo.optimize import minimize
    from pymoo.util import default_random_state
    from pymoo.util.nds.non_dominated_sorting import NonDominatedSorting
except ImportError as e:
    raise AutodiceError(f"dse needs pymoo >= 0.6.1.6 ({e}): pip install 'pymoo>=0.6.1.6,<0.7'"
                        ) from None

if TYPE_CHECKING:
    from .settings import Settings


def objectives(s, settings: Settings | None = None) -> tuple[np.ndarray, np.ndarray]:
    """pymoo's F (all minimised: -throughput, max energy J, max memory MB, those the settings
    choose) and G (<= 0 feasible: memory over each device's capacity and over ``max_memory``,
    throughput under ``min_fps``, as fractions; cut tensors without a static shape)."""
    columns = {"throughput": -s.throughput, "energy": s.max_energy,
               "memory": s.max_memory / 1e6}
    chosen = settings.objectives if settings else tuple(columns)
    F = np.column_stack([columns[o] for o in chosen])
    cap = settings.max_memory if settings else None
    floor = settings.min_fps if settings else None
    G = np.column_stack([s.excess, s.bad_cuts.astype(float),
                         (s.max_memory - cap) / cap if cap else -np.ones(len(F)),
                         (floor - s.throughput) / floor if floor else -np.ones(len(F))])
    return F, G


class MappingProblem(Problem):
    """The chosen objectives and the constraints of a mapping, scored by the cost model."""

    def __init__(self, genes: Genes, settings: Settings):
        super().__init__(n_var=genes.n_var, n_obj=len(settings.objectives), n_ieq_constr=4,
                         xl=genes.xl, xu=genes.xu, vtype=int)
        self.genes, self.settings = genes, settings
        self.evaluations = 0

    def _evaluate(self, X, out, *args, **kwargs):
        genes = self.genes
        out["F"], out["G"] = objectives(genes.cm.evaluate(genes.decode(X)), self.settings)
        self.evaluations += len(X)


class MappingSampling(Sampling):
    """The first population: every resource alone, time-balanced pipelines over random
    resource sequences, and random contiguous mappings (random per-layer genes are hopeless:
    every layer boundary becomes a transfer); in fp32, but a third of them with random groups
    of cores in int8 where the profile timed it."""

    def __init__(self, genes: Genes):
        super().__init__()
        self.genes = genes

    def _do(self, problem, n_samples, *args, random_state=None, **kwargs):
        genes, rng = self.genes, random_state
        cm, N, A = genes.cm, genes.cm.n_layers, genes.n_alpha
        rows = []
        singles = list(range(A)) if A <= n_samples // 2 else list(
            rng.choice(A, n_samples // 2, replace=False))
        rows += [np.full(N, a) for a in singles]
        n_balanced = (n_samples - len(rows)) // 2
        while len(rows) < n_samples:
            k = int(rng.integers(2, min(A, 8, N) + 1)) if min(A, N) >= 2 else 1
            seq = rng.choice(A, k, replace=False)
            if len(rows) < len(singles) + n_balanced:
                starts = balanced_cuts(cm.time[:, genes.alpha[seq]], k)
            else:
                starts = np.concatenate([[0], np.sort(rng.choice(np.arange(1, N), k - 1,
                                                                 replace=False))])
            layer = seq[np.searchsorted(starts, np.arange(N), side="right") - 1]
            rows.append(layer)
        rows = rows[:n_samples]
        precision = [None] * len(rows)
        if genes.n_precision:
            for k in rng.choice(len(rows), len(rows) // 3, replace=False):
                precision[k] = rng.integers(0, 2, genes.n_precision)
        return np.array([genes.encode_layers(r, q) for r, q in zip(rows, precision)])


class MappingMutation(Mutation):
    """Moves that keep mappings pipeline-shaped: shift a boundary between two runs, give a
    window of layers a neighbour's or a random resource, or move a whole run elsewhere; or
    turn a group of cores to int8 or back (a fifth of the moves, where there are such genes)."""

    def __init__(self, genes: Genes, prob: float):
        super().__init__(prob=prob)
        self.genes = genes

    @default_random_state
    def do(self, problem, pop, inplace=True, *args, random_state=None, **kwargs):
        # pymoo's Mutation.do mutates every individual, then keeps the `prob` share of them;
        # choosing first and mutating only those is the same operator, several times faster.
        if not inplace:
            pop = copy.deepcopy(pop)
        X = pop.get("X")
        chosen = random_state.random(len(pop)) <= get(self.prob, size=len(pop))
        if chosen.any():
            Xp = X.copy()
            Xp[chosen] = self._do(problem, X[chosen], random_state=random_state)
            pop.set("X", Xp)
        return pop

    def _do(self, problem, X, *args, random_state=None, **kwargs):
        genes, rng = self.genes, random_state
        X = X.copy()
        N, A = genes.cm.n_layers, genes.n_alpha
        for row in X:
            if genes.n_precision and rng.random() < 0.2:
                j = genes.n_map + int(rng.integers(genes.n_precision))
                row[j] = 1 - row[j]
                continue
            x = row[:genes.n_map]  # a view: the moves below change the row
            if genes.encoding == "segment":
                j = int(rng.integers(genes.n_map))
                if j < genes.k - 1:
                    x[j] = (int(rng.integers(N + 1)) if rng.random() < 0.5 else
                            int(np.clip(x[j] + round(rng.normal(0, N / 10)), 0, N)))
                else:
                    x[j] = int(rng.integers(A))
                continue
            move = rng.random()
            bounds = np.flatnonzero(x[1:] != x[:-1]) + 1
            if move < 1 / 3 and bounds.size:
                b = int(rng.choice(bounds))
                d = int(rng.geometric(min(1.0, 8 / N))) * (1 if rng.random() < 0.5 else -1)
                lo, hi = sorted((b, int(np.clip(b + d, 0, N))))
                x[lo:hi] = x[b - 1] if d > 0 else x[b]
            elif move < 2 / 3:
                a = int(rng.integers(N))
                e = min(N, a + int(rng.geometric(min(1.0, 8 / N))))
                if rng.random() < 0.5:
                    x[a:e] = x[a - 1] if a > 0 and (e == N or rng.random() < 0.5) else x[e % N]
                else:
                    x[a:e] = int(rng.integers(A))
            else:
                starts = np.concatenate([[0], bounds])
                j = int(rng.integers(len(starts)))
                e = starts[j + 1] if j + 1 < len(starts) else N
                x[starts[j]:e] = int(rng.integers(A))
        return X


class MappingRepair(Repair):
    """Genes into range; segment cuts sorted, so equal mappings have equal genes."""

    def __init__(self, genes: Genes):
        super().__init__()
        self.genes = genes

    def _do(self, problem, X, **kwargs):
        genes = self.genes
        X = np.clip(np.rint(X).astype(np.int64), genes.xl, genes.xu)
        if genes.encoding == "segment":
            X[:, :genes.k - 1] = np.sort(X[:, :genes.k - 1], axis=1)
        return X


class SameMapping(DuplicateElimination):
    """Offspring equal to a parent or a sibling *as mappings* are dropped (hashing the
    decoded rows: pymoo's default compares every pair of genes with cdist)."""

    def __init__(self, genes: Genes):
        super().__init__()
        self.genes = genes

    def rows(self, X):
        # The layer encoding without precision genes is one-to-one with mappings: its genes are
        # the key (a group's precision gene means nothing when the row uses none of its cores).
        X = np.asarray(X, dtype=np.int64)
        plain = self.genes.encoding == "layer" and not self.genes.n_precision
        return X if plain else self.genes.decode(X)

    def _do(self, pop, other, is_duplicate):
        seen = set() if other is None else {r.tobytes() for r in self.rows(other.get("X"))}
        for k, r in enumerate(self.rows(pop.get("X"))):
            b = r.tobytes()
            if b in seen:
                is_duplicate[k] = True
            elif other is None:
                seen.add(b)
        return is_duplicate


class Progress(Callback):
    """Reports (generation, generations) after each generation, for a progress bar."""

    def __init__(self, gens: int, progress: Callable[[int, int], None] | None):
        super().__init__()
        self.gens, self.progress = gens, progress

    def notify(self, algorithm):
        if self.progress:
            self.progress(algorithm.n_gen, self.gens)


def nsga2(genes: Genes, settings: Settings,
          progress: Callable[[int, int], None] | None = None):
    """Run NSGA-II over ``genes``; the last population's (X, F, G) and the evaluations made.

    The algorithm is built for this one run, so pymoo need not copy it (``copy_algorithm``):
    its operators hold the cost model, which a deep copy would duplicate for nothing.
    """
    s = settings
    problem = MappingProblem(genes, s)
    algorithm = NSGA2(pop_size=s.pop, sampling=MappingSampling(genes),
                      crossover=TwoPointCrossover(prob=s.crossover),
                      mutation=MappingMutation(genes, prob=s.mutation), repair=MappingRepair(genes),
                      eliminate_duplicates=SameMapping(genes))
    res = minimize(problem, algorithm, ("n_gen", s.gens), seed=s.seed,
                   callback=Progress(s.gens, progress), verbose=False, copy_algorithm=False)
    last = res.algorithm.pop
    return last.get("X"), last.get("F"), last.get("G"), problem.evaluations


def non_dominated(F: np.ndarray) -> np.ndarray:
    """Indices of the rows of ``F`` no other row dominates."""
    return NonDominatedSorting().do(F, only_non_dominated_front=True)
