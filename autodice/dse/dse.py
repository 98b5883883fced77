"""``autodice dse``: search mappings with NSGA-II for throughput, per-device energy and memory.

The AutoDiCE paper's search, made cheap by the cost model (:mod:`autodice.cost`) instead of runs
on the boards: pymoo's NSGA-II (population 100, 400 generations, crossover 0.5, mutation 0.1 by
default, as in the paper) over mappings, three objectives -- throughput (max), the largest
per-device energy per frame (min), the largest per-device memory (min) -- and the devices' memory
as a constraint. A seed reproduces the front.

Encodings (``Genes``):

* ``layer`` (the paper's): one gene per mapped layer, its resource among {one core, all cores,
  GPU} of each device. Decoding repairs overlaps: a device whose "one core" and "all cores" are
  both used gets two disjoint ranks, its first core and the others.
* ``segment``: the layers in topological order cut into at most K contiguous runs; genes are the
  K-1 cut positions and each run's resource. A smaller space of pipeline-shaped mappings.

Every emitted front point goes through the compiler's own passes (``check_resources``,
``assign_ranks``, ``find_edges``, ``build_plan``, ``check_plan``), and its plan-based cost must
equal the fast path's, so the files in ``OUT/mappings/`` are mappings ``split`` accepts.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.errors import AutodiceError
from ..core.model import Graph, load_model
from ..core.outdir import staged
from ..core.spec import Platform, mapping_json, parse_mapping_text, parse_platform
from ..frontend.partition import build_plan, find_edges
from ..frontend.place import assign_ranks, check_resources
from ..frontend.validate import check_plan
from .cost import Cost, plan_cost
from .cost_model import CostModel
from .timing import Timing, make_timing

ENCODINGS = ("layer", "segment")


@dataclass(frozen=True)
class Settings:
    """Search settings; the defaults are the paper's."""

    pop: int = 100
    gens: int = 400
    seed: int = 0
    crossover: float = 0.5  # probability that a pair of parents is crossed (two-point)
    mutation: float = 0.1  # probability that an offspring is mutated
    encoding: str = "layer"
    segments: int | None = None  # K for the segment encoding (default: number of resources, <=16)

    def check(self) -> None:
        bad = []
        if self.pop < 4:
            bad.append(f"--pop {self.pop}: needs at least 4")
        if self.gens < 1:
            bad.append(f"--gens {self.gens}: needs at least 1")
        if self.encoding not in ENCODINGS:
            bad.append(f'--encoding "{self.encoding}": one of {", ".join(ENCODINGS)}')
        for name, p in (("crossover", self.crossover), ("mutation", self.mutation)):
            if not 0 <= p <= 1:
                bad.append(f"--{name} {p}: a probability, 0..1")
        if self.segments is not None and self.segments < 1:
            bad.append(f"--segments {self.segments}: needs at least 1")
        if bad:
            raise AutodiceError(*bad)


# ----------------------------------------------------------------------------- encoding


class Genes:
    """Genes <-> slot arrays (:class:`~autodice.dse.cost.CostModel` columns), both encodings."""

    def __init__(self, cm: CostModel, encoding: str = "layer", segments: int | None = None):
        self.cm, self.encoding = cm, encoding
        slots = cm.slots
        # The alphabet: the paper's one core / all cores / GPU per device ("rest" is a repair).
        self.alpha = np.array([k for k, s in enumerate(slots) if s.kind != "rest"])
        self.n_alpha = len(self.alpha)
        S = len(slots)
        self.rest_of = np.arange(S)  # slot -> the slot it becomes when its device's core 0 is taken
        self.one_of = np.arange(S)  # slot -> the "one core" slot of its device
        self.is_all = np.zeros(S, dtype=bool)
        for k, s in enumerate(slots):
            self.one_of[k] = next(j for j, x in enumerate(slots) if x.dev == s.dev
                                  and x.kind == "one")
            if s.kind == "all":
                self.is_all[k] = True
                self.rest_of[k] = next(j for j, x in enumerate(slots) if x.dev == s.dev
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

    def layer_genes(self, X: np.ndarray) -> np.ndarray:
        """Alphabet index per layer (the segment encoding expanded)."""
        X = np.asarray(X, dtype=np.int64)
        if self.encoding == "layer":
            return X
        k = self.k
        cuts = np.sort(X[:, :k - 1], axis=1)
        seg = (np.arange(self.cm.n_layers)[None, :, None] >= cuts[:, None, :]).sum(axis=2)
        return np.take_along_axis(X[:, k - 1:], seg, axis=1)

    def decode(self, X: np.ndarray) -> np.ndarray:
        """(P, n_var) genes -> (P, N) slot indices, overlapping cores repaired."""
        slots = self.alpha[self.layer_genes(np.atleast_2d(X))]
        P = len(slots)
        present = np.zeros((P, self.cm.n_slots), dtype=bool)
        present[np.arange(P)[:, None], slots] = True
        clash = self.is_all[slots] & present[np.arange(P)[:, None], self.one_of[slots]]
        return np.where(clash, self.rest_of[slots], slots)

    def encode_layers(self, genes: np.ndarray) -> np.ndarray:
        """Alphabet indices per layer -> this encoding's genes (runs become segments; more runs
        than K are merged into the last segment)."""
        genes = np.asarray(genes)
        if self.encoding == "layer":
            return genes
        starts = [0] + [p for p in range(1, len(genes)) if genes[p] != genes[p - 1]]
        starts = starts[:self.k]
        cuts = starts[1:] + [self.cm.n_layers] * (self.k - len(starts))
        res = [genes[p] for p in starts] + [genes[starts[-1]]] * (self.k - len(starts))
        return np.array(cuts + res)


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


# ----------------------------------------------------------------------------- pymoo pieces


def _pymoo():
    try:
        from pymoo.algorithms.moo.nsga2 import NSGA2
        from pymoo.core.callback import Callback
        from pymoo.core.mutation import Mutation
        from pymoo.core.problem import Problem
        from pymoo.core.repair import Repair
        from pymoo.core.sampling import Sampling
        from pymoo.operators.crossover.pntx import TwoPointCrossover
        from pymoo.optimize import minimize
        from pymoo.util.nds.non_dominated_sorting import NonDominatedSorting
    except ImportError:
        raise AutodiceError("dse needs pymoo 0.6: pip install 'autodice[dse]'") from None
    return (NSGA2, Callback, Mutation, Problem, Repair, Sampling, TwoPointCrossover, minimize,
            NonDominatedSorting)


def objectives(s) -> tuple[np.ndarray, np.ndarray]:
    """pymoo's F (all minimised: -throughput, max energy J, max memory MB) and G (<= 0 feasible:
    memory over capacity as a fraction, cut tensors without a static shape)."""
    F = np.column_stack([-s.throughput, s.max_energy, s.max_memory / 1e6])
    G = np.column_stack([s.excess, s.bad_cuts.astype(float)])
    return F, G


def make_problem(genes: Genes):
    (_, _, Mutation, Problem, Repair, Sampling, *_) = _pymoo()
    from pymoo.core.duplicate import DuplicateElimination
    from pymoo.core.variable import get
    from pymoo.util import default_random_state

    class MappingProblem(Problem):
        """Three objectives and two constraints of a mapping, scored by the cost model."""

        def __init__(self):
            super().__init__(n_var=genes.n_var, n_obj=3, n_ieq_constr=2, xl=genes.xl,
                             xu=genes.xu, vtype=int)
            self.evaluations = 0

        def _evaluate(self, X, out, *args, **kwargs):
            out["F"], out["G"] = objectives(genes.cm.evaluate(genes.decode(X)))
            self.evaluations += len(X)

    class MappingSampling(Sampling):
        """The first population: every resource alone, time-balanced pipelines over random
        resource sequences, and random contiguous mappings (random per-layer genes are hopeless:
        every layer boundary becomes a transfer)."""

        def _do(self, problem, n_samples, *args, random_state=None, **kwargs):
            rng = random_state
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
            return np.array([genes.encode_layers(r) for r in rows[:n_samples]])

    class MappingMutation(Mutation):
        """Moves that keep mappings pipeline-shaped: shift a boundary between two runs, give a
        window of layers a neighbour's or a random resource, or move a whole run elsewhere."""

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
            rng = random_state
            X = X.copy()
            N, A = genes.cm.n_layers, genes.n_alpha
            for x in X:
                if genes.encoding == "segment":
                    j = int(rng.integers(genes.n_var))
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

        def _do(self, problem, X, **kwargs):
            X = np.clip(np.rint(X).astype(np.int64), genes.xl, genes.xu)
            if genes.encoding == "segment":
                X[:, :genes.k - 1] = np.sort(X[:, :genes.k - 1], axis=1)
            return X

    class SameMapping(DuplicateElimination):
        """Offspring equal to a parent or a sibling *as mappings* are dropped (hashing the
        decoded rows: pymoo's default compares every pair of genes with cdist)."""

        @staticmethod
        def rows(X):
            # The layer encoding is one-to-one with mappings: its genes are the key.
            X = np.asarray(X, dtype=np.int64)
            return X if genes.encoding == "layer" else genes.decode(X)

        def _do(self, pop, other, is_duplicate):
            seen = set() if other is None else {r.tobytes() for r in self.rows(other.get("X"))}
            for k, r in enumerate(self.rows(pop.get("X"))):
                b = r.tobytes()
                if b in seen:
                    is_duplicate[k] = True
                elif other is None:
                    seen.add(b)
            return is_duplicate

    return MappingProblem(), MappingSampling(), MappingMutation, MappingRepair(), SameMapping()


# ----------------------------------------------------------------------------- the search


@dataclass(frozen=True)
class Point:
    """One mapping of the front (or a reference) with its predicted cost."""

    name: str
    mapping: dict[str, list[str]]
    cost: Cost

    @property
    def devices(self) -> int:
        return len(self.cost.devices)


@dataclass(frozen=True)
class Front:
    points: tuple[Point, ...]  # by throughput, fastest first
    references: tuple[Point, ...]  # 1-device CPU, 1-device GPU
    settings: Settings
    evaluations: int
    seconds: float
    notes: tuple[str, ...] = field(default=())


def explore(graph: Graph, timing: Timing, settings: Settings = Settings(),
            progress: Callable[[int, int], None] | None = None) -> Front:
    """Run NSGA-II and return the non-dominated feasible mappings of the last population.

    Raises:
        AutodiceError: bad settings, a profile that does not fit the model, or no mapping that
            fits the devices' memory.
    """
    settings.check()
    NSGA2, Callback, *_, minimize, NonDominatedSorting = _pymoo()
    from pymoo.operators.crossover.pntx import TwoPointCrossover

    cm = CostModel(graph, timing)
    genes = Genes(cm, settings.encoding, settings.segments)
    problem, sampling, Mutation, repair, duplicates = make_problem(genes)

    class Progress(Callback):
        def notify(self, algorithm):
            if progress:
                progress(algorithm.n_gen, settings.gens)

    algorithm = NSGA2(pop_size=settings.pop, sampling=sampling,
                      crossover=TwoPointCrossover(prob=settings.crossover),
                      mutation=Mutation(prob=settings.mutation), repair=repair,
                      eliminate_duplicates=duplicates)
    start = time.perf_counter()
    res = minimize(problem, algorithm, ("n_gen", settings.gens), seed=settings.seed,
                   callback=Progress(), verbose=False)
    seconds = time.perf_counter() - start
    pop = res.algorithm.pop
    X, F, G = pop.get("X"), pop.get("F"), pop.get("G")
    feasible = (G <= 0).all(axis=1)
    if not feasible.any():
        s = cm.evaluate(genes.decode(X))
        best = int(np.argmin(s.excess))
        raise AutodiceError(f"{timing.platform.path}: no mapping found that fits the devices' "
                            f"memory (closest: {cm.cost(genes.decode(X[best])[0]).over_capacity})")
    X, F = X[feasible], F[feasible]
    keep = NonDominatedSorting().do(F, only_non_dominated_front=True)
    slots = np.unique(genes.decode(X[keep]), axis=0)
    points = [(cm.cost(g), g) for g in slots]
    points.sort(key=lambda p: (-p[0].throughput, p[0].max_energy_j, p[0].max_memory,
                               len(p[0].ranks), tuple(p[1])))
    # Mappings that differ only off the critical path tie on all three objectives: keep the
    # one with the fewest ranks of each tie (the front is about trade-offs, not variants).
    seen: set[tuple[float, float, int]] = set()
    distinct = []
    for c, g in points:
        key = (_g(c.throughput), _g(c.max_energy_j), c.max_memory)
        if key not in seen:
            seen.add(key)
            distinct.append((c, g))
    points = distinct
    width = len(str(len(points) - 1))
    front = tuple(Point(f"p{k:0{width}d}", cm.mapping(g), c) for k, (c, g) in enumerate(points))
    return Front(front, references(cm), settings, problem.evaluations, seconds, cm.notes)


def references(cm: CostModel) -> tuple[Point, ...]:
    """The paper's baselines: the whole model on the best single device's CPU (all its cores),
    and on the best single GPU."""
    out = []
    for label, kinds in (("1-device CPU", ("all", "one")), ("1-device GPU", ("gpu",))):
        best = None
        for dev in sorted({s.dev for s in cm.slots}):
            k = next((k for kind in kinds for k, s in enumerate(cm.slots)
                      if s.dev == dev and s.kind == kind), None)
            if k is None:
                continue
            g = np.full(cm.n_layers, k)
            c = cm.cost(g)
            if best is None or c.throughput > best[0].throughput:
                best = (c, g)
        if best:
            out.append(Point(label, cm.mapping(best[1]), best[0]))
    return tuple(out)


def verify_point(graph: Graph, platform: Platform, timing: Timing, point: Point) -> None:
    """Run the split passes on ``point.mapping`` and hold its plan cost to the fast path's.

    Raises:
        AutodiceError: the mapping is not one ``split`` accepts, or the two costs differ (an
            internal error: the fast path and the compiler disagree).
    """
    mapping = parse_mapping_text(mapping_json(point.mapping), f"mappings/{point.name}.json")
    resources = check_resources(mapping, platform)
    placement = assign_ranks(graph, mapping, resources, platform)
    edges = find_edges(graph, placement, mapping.path)
    plan = build_plan(graph, placement, edges, Path("."), graph.path)
    check_plan(plan)
    slow, fast = plan_cost(plan, timing, graph), point.cost
    same = (abs(slow.throughput - fast.throughput) <= 1e-6 * fast.throughput
            and slow.max_memory == fast.max_memory
            and abs(slow.max_energy_j - fast.max_energy_j) <= 1e-6 * max(fast.max_energy_j, 1e-12))
    if not same:
        raise AutodiceError(f"internal error: point {point.name}: the cost model's fast path "
                            f"({fast.throughput:.6g} fps, {fast.max_memory} B) and the plan "
                            f"({slow.throughput:.6g} fps, {slow.max_memory} B) disagree")


# ----------------------------------------------------------------------------- outputs


def _g(x: float) -> float:
    """Six significant digits: stable text across runs and machines."""
    return float(f"{x:.6g}")


def point_row(p: Point) -> dict:
    c = p.cost
    return {"point": p.name, "throughput_fps": _g(c.throughput), "energy_j": _g(c.max_energy_j),
            "memory_bytes": c.max_memory, "devices": p.devices, "cores": c.cores, "gpus": c.gpus,
            "ranks": len(c.ranks), "period_s": _g(c.period_s), "bottleneck": c.bottleneck}


def point_json(p: Point, mapping_file: str | None) -> dict:
    c = p.cost
    return {**point_row(p), "mapping": mapping_file,
            "devices_detail": [{"host": d.host, "memory_bytes": d.memory, "ram_bytes": d.ram,
                                "gpu_mem_bytes": d.gpu_mem, "energy_j": _g(d.energy_j)}
                               for d in c.devices],
            "ranks_detail": [{"rank": r.rank, "key": r.key, "layers": r.layers,
                              "compute_s": _g(r.compute_s), "comm_s": _g(r.comm_s),
                              "memory_bytes": r.memory} for r in c.ranks],
            "over_capacity": list(c.over_capacity)}


def write_front(front: Front, out: Path, model: str, platform: str) -> None:
    """``OUT/pareto.csv``, ``pareto.json``, ``mappings/<point>.json``, ``pareto.png`` (written to
    a temporary directory, then renamed)."""
    out = Path(out)
    if out.exists() and (out / "pareto.json").exists():
        owned = True
    else:
        owned = False
    with staged(out, owned=owned) as tmp:
        (tmp / "mappings").mkdir()
        for p in front.points:
            (tmp / "mappings" / f"{p.name}.json").write_text(mapping_json(p.mapping))
        buf = io.StringIO()
        cols = list(point_row(front.points[0]))
        writer = csv.DictWriter(buf, cols + ["mapping"], lineterminator="\n")
        writer.writeheader()
        for p in front.points:
            writer.writerow({**point_row(p), "mapping": f"mappings/{p.name}.json"})
        (tmp / "pareto.csv").write_text(buf.getvalue())
        s = front.settings
        doc = {"model": model, "platform": platform,
               "settings": {"pop": s.pop, "gens": s.gens, "seed": s.seed, "crossover": s.crossover,
                            "mutation": s.mutation, "encoding": s.encoding,
                            "segments": s.segments},
               "evaluations": front.evaluations,
               "objectives": {"throughput_fps": "max", "energy_j": "min (largest per device, "
                              "per frame)", "memory_bytes": "min (largest per device)"},
               "points": [point_json(p, f"mappings/{p.name}.json") for p in front.points],
               "references": [{**point_json(p, None), "mapping_keys": list(p.mapping)}
                              for p in front.references],
               "notes": list(front.notes)}
        (tmp / "pareto.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        plot_front(front, tmp / "pareto.png")


def plot_front(front: Front, path: Path) -> None:
    """The front in three projections, references marked; byte-stable PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = {"fps": [p.cost.throughput for p in front.points],
              "mj": [p.cost.max_energy_j * 1e3 for p in front.points],
              "mb": [p.cost.max_memory / 1e6 for p in front.points]}
    refs = {"fps": [p.cost.throughput for p in front.references],
            "mj": [p.cost.max_energy_j * 1e3 for p in front.references],
            "mb": [p.cost.max_memory / 1e6 for p in front.references]}
    label = {"fps": "throughput (frames/s)", "mj": "max per-device energy (mJ/frame)",
             "mb": "max per-device memory (MB)"}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for ax, (x, y, c) in zip(axes, (("fps", "mj", "mb"), ("fps", "mb", "mj"),
                                     ("mj", "mb", "fps"))):
        sc = ax.scatter(values[x], values[y], c=values[c], cmap="viridis", s=22,
                        label="Pareto front")
        fig.colorbar(sc, ax=ax, label=label[c])
        for k, p in enumerate(front.references):
            ax.scatter([refs[x][k]], [refs[y][k]], marker="*^"[k % 2], s=120,
                       color="tab:red", label=p.name)
        ax.set_xlabel(label[x])
        ax.set_ylabel(label[y])
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    s = front.settings
    fig.suptitle(f"NSGA-II front: {len(front.points)} mappings ({s.encoding} encoding, "
                 f"pop {s.pop}, {s.gens} generations, seed {s.seed})")
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def table_rows(front: Front, limit: int = 12) -> list[Point]:
    """The points the printed table shows: all when few, else the extremes and evenly spaced
    ones in between (the CSV has them all)."""
    pts = list(front.points)
    if len(pts) <= limit:
        return pts
    pick = set(np.unique(np.round(np.linspace(0, len(pts) - 1, limit - 2)).astype(int)))
    pick.add(min(range(len(pts)), key=lambda k: pts[k].cost.max_energy_j))
    pick.add(min(range(len(pts)), key=lambda k: pts[k].cost.max_memory))
    return [pts[k] for k in sorted(pick)]


def profile_arg(specs, model, platform):
    """``--profile`` values -> what :func:`autodice.dse.cost.make_timing` takes.

    ``FILE`` is the profile of every host, ``HOST=FILE`` of one host (a path that exists is
    taken as a file even if it holds ``=``). With none, the model is profiled now when this
    autodice has a profiler.

    Raises:
        AutodiceError: unreadable profiles, or none given and no profiler to make one.
    """
    from .profile import load_profile

    if not specs:
        return measure_profile(model, platform)
    out: dict = {}
    for spec in specs:
        host, eq, path = spec.partition("=")
        if not eq or Path(spec).exists():
            host, path = None, spec
        if host in out:
            raise AutodiceError(f"--profile {spec}: a second profile for "
                                f"{'host ' + host if host else 'all hosts'}")
        out[host] = load_profile(path)
    return out


def measure_profile(model, platform):
    """Profile ``model`` on this machine for ``platform`` (what ``dse`` does when given no
    profile)."""
    from .profiler import profile_model

    return profile_model(model, platform)


def dse(model: str | Path, platform: str | Path, profile, out: str | Path,
        settings: Settings = Settings(), progress=None, power=None) -> Front:
    """Search, verify every front point with the split passes, write ``out``.

    Args:
        profile: a profile.json path or Profile, or ``{host: ...}`` (key None: the default).
    Raises:
        AutodiceError: bad inputs (all listed); ``out`` is untouched then.
    """
    settings.check()
    platform_spec = parse_platform(platform)
    graph = load_model(model)
    timing = make_timing(platform_spec, profile, power)
    front = explore(graph, timing, settings, progress)
    for p in front.points:
        verify_point(graph, platform_spec, timing, p)
    write_front(front, Path(out), str(model), str(platform))
    return front


# ----------------------------------------------------------------------------- --measure


@dataclass(frozen=True)
class Measurement:
    point: str
    predicted_fps: float
    runs_fps: tuple[float, ...]  # one per round, in round order
    predicted_memory: int  # bytes, largest device
    measured_memory: int  # bytes, largest host's summed peak RSS (median over the rounds)
    notes: tuple[str, ...]

    @property
    def measured_fps(self) -> float:
        """The median round: one slow round (a busy neighbour on a shared machine) moves it
        less than it moves the mean."""
        return float(np.median(self.runs_fps))

    @property
    def fps_error(self) -> float:
        return (self.measured_fps - self.predicted_fps) / self.predicted_fps

    @property
    def memory_error(self) -> float:
        return (self.measured_memory - self.predicted_memory) / max(self.predicted_memory, 1)


def pick_points(n: int, k: int) -> list[int]:
    """``k`` front indices spread from the fastest to the slowest point."""
    return sorted(set(np.round(np.linspace(0, n - 1, min(k, n))).astype(int).tolist()))


def measure(out: str | Path, model: str | Path, platform: str | Path, profile, k: int,
            frames: int = 100, rounds: int = 5, inventory: str | Path | None = None,
            progress=None, power=None) -> list[Measurement]:
    """Re-run ``k`` front points of ``out`` for real: split -> gen -> build -> run, ``rounds``
    times each.

    Without ``inventory`` every rank runs here under mpirun (hosts mapped to localhost; when the
    plan needs more cores than this machine has, ranks are oversubscribed and the note says so).
    With it, each point is deployed to the inventory's hosts and run there (``autodice deploy
    --run``). The rounds visit the points in turn, so a stretch of time when the machine is busy
    with something else slows one round of each point rather than every round of one point;
    each point's figure is its median round. Writes ``out/measure/<point>/`` and
    ``out/measure.json``.

    Raises:
        AutodiceError: no front in ``out``, or a step failed (its message).
    """
    from ..backend.build import build
    from ..backend.gen import gen
    from ..frontend.split import split

    if rounds < 1 or frames < 1:
        raise AutodiceError(f"--rounds {rounds} --frames {frames}: need at least 1 of each")
    out = Path(out)
    try:
        doc = json.loads((out / "pareto.json").read_text())
    except (OSError, json.JSONDecodeError):
        raise AutodiceError(f"{out}/pareto.json: no front here; run `autodice dse` first") from None
    names = [doc["points"][i]["point"] for i in pick_points(len(doc["points"]), k)]
    timing = make_timing(platform, profile, power)
    graph = load_model(model)
    steps = len(names) * (rounds + 1)
    say = progress or (lambda done, total, what: None)
    (out / "measure").mkdir(exist_ok=True)
    points = []
    for step, name in enumerate(names):
        work = out / "measure" / name
        say(step, steps, f"{name}: split, gen, build")
        plan = split(model, out / "mappings" / f"{name}.json", platform, work)
        gen(work)
        if inventory is None:
            build(work)
        points.append((name, work, plan, _measure_inputs(plan, work)))
    runs: dict[str, list[tuple[float, int]]] = {name: [] for name in names}
    elsewhere: dict[str, float] = {name: 0.0 for name in names}
    for rnd in range(rounds):
        for j, (name, work, plan, inputs) in enumerate(points):
            say(len(names) * (rnd + 1) + j, steps, f"{name}: round {rnd + 1} of {rounds}")
            before = _cpu_clock()
            stats = _run_point(work, inputs, frames, inventory)
            if inventory is None:  # remote ranks are not our children: no gauge
                elsewhere[name] = max(elsewhere[name], _busy_elsewhere(before, _cpu_clock()))
            by_host: dict[str, int] = {}
            for r, st in zip(plan.ranks, stats["ranks"]):
                by_host[r.host] = by_host.get(r.host, 0) + int(st["peak_rss"])
            runs[name].append((float(stats["fps"]), max(by_host.values())))
    cpus = os.cpu_count() or 1
    results = []
    for name, work, plan, _ in points:
        predicted = plan_cost(plan, timing, graph)
        notes = _measure_notes(plan, cpus, elsewhere[name], inventory)
        results.append(Measurement(name, predicted.throughput, tuple(f for f, _ in runs[name]),
                                   predicted.max_memory,
                                   int(np.median([m for _, m in runs[name]])), tuple(notes)))
    (out / "measure.json").write_text(json.dumps(
        [{"point": m.point, "predicted_fps": _g(m.predicted_fps), "measured_fps": _g(m.measured_fps),
          "runs_fps": [_g(f) for f in m.runs_fps], "fps_error": _g(m.fps_error),
          "predicted_memory_bytes": m.predicted_memory,
          "measured_peak_rss_bytes": m.measured_memory, "memory_error": _g(m.memory_error),
          "frames": frames, "where": "here" if inventory is None else str(inventory),
          "notes": list(m.notes)} for m in results], indent=1, sort_keys=True) + "\n")
    return results


def _measure_inputs(plan, work: Path) -> dict[str, Path]:
    """Seeded random inputs of the plan's input shapes, saved in ``work``."""
    rng = np.random.default_rng(0)
    inputs = {}
    for t in plan.model_inputs:
        path = work / f"input_{len(inputs)}.npy"
        np.save(path, rng.standard_normal(t.shape).astype(t.dtype))
        inputs[t.name] = path
    return inputs


def _run_point(work: Path, inputs: dict[str, Path], frames: int, inventory) -> dict:
    """One run of a built point: here, or deployed (a no-op sync after the first) and run."""
    if inventory is None:
        from ..backend.run import run

        return run(work, inputs, frames=frames).stats
    from ..deploy.deploy import deploy

    res = deploy(work, inventory, run=True, inputs=inputs, frames=frames)
    assert res.run is not None
    return res.run.stats


def _cpu_clock() -> tuple[float, float, float]:
    """(wall s, CPU s busy on this machine, CPU s of our finished child processes)."""
    import resource

    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.monotonic(), busy, kids.ru_utime + kids.ru_stime


def _busy_elsewhere(before, after) -> float:
    """Share of this machine's cores that something other than our run kept busy between two
    :func:`_cpu_clock` readings (other processes, or the hypervisor's steal)."""
    wall = after[0] - before[0]
    others = (after[1] - before[1]) - (after[2] - before[2])
    return max(others, 0.0) / max(wall * (os.cpu_count() or 1), 1e-9)


def _measure_notes(plan, cpus: int, elsewhere: float, inventory) -> list[str]:
    notes = []
    if inventory is None:
        threads = sum(r.threads for r in plan.ranks)
        if threads > cpus:
            notes.append(f"oversubscribed: {threads} threads on {cpus} cores here")
        if len(plan.hosts()) > 1:
            notes.append(f"{len(plan.hosts())} hosts ran on localhost (shared memory, not the "
                         f"network)")
        if any(r.device == "gpu" for r in plan.ranks):
            notes.append("GPU ranks ran on this machine's CPU")
    if elsewhere >= 0.1:
        notes.append(f"other work kept up to {elsewhere:.0%} of the cores busy during its runs")
    return notes
