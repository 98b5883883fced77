"""DSE benchmark: NSGA-II's 40,000 evaluations (population 100 x 400 generations) on DenseNet-121.

Measures, side by side in one run on the zoo DenseNet-121 (910 nodes) over 8 Jetson-like boards
(6 cores + GPU each: 32 resources, 668 genes): the whole search (goal: <= 60 s), the cost model
alone on 40,000 candidates, the split passes on every front point, and whether the front
dominates 1,000 random valid mappings (500 with a random resource per layer, the paper's
encoding, and 500 random pipelines of 1-8 contiguous runs). Prints a table; writes JSON.

Layer latencies: ``--profile profile.json`` (from ``autodice profile``) when given; otherwise a
SYNTHETIC stand-in derived from FLOPs (10 GFLOP/s per core, 55 % of the time on 2 threads, GPU
5x faster) -- enough to time the search, not a prediction of any board.

Run: ``python bench/dse_bench.py [--profile profile.json] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from autodice.core.model import load_model
from autodice.core.spec import parse_platform
from autodice.dse.cost_model import CostModel
from autodice.dse.genes import Genes
from autodice.dse.problem import objectives
from autodice.dse.profile import LayerCost, Link, Profile, load_profile
from autodice.dse.search import Settings, explore, verify_point
from autodice.dse.timing import Timing
from autodice.frontend import zoo
from autodice.frontend.layers import layer_table

GOAL_S = 60.0
BOARD = ("arm, slots=0-5, gpu=NVIDIAVolta (CUDA), mem=8GB, power_idle=4.5W, power_cpu=1W, "
         "power_gpu=10W, bandwidth=1gbit, latency=0.2ms")


def synthetic_profile(graph) -> Profile:
    """SYNTHETIC latencies from FLOPs (not measured): 2 us + FLOPs at 10 GFLOP/s on one core."""
    layers = []
    for row in layer_table(graph):
        if row["follows"]:
            continue
        t1 = 0.002 + row["flops"] / 1e7
        layers.append(LayerCost(row["name"], row["op"], {1: t1, 2: 0.002 + (t1 - 0.002) * 0.55},
                                t1 / 5 + 0.01))
    return Profile(str(graph.path), "synthetic", {"synthetic": "from FLOPs"}, {}, (1, 2),
                   tuple(layers), {"shm": Link(5e9, 2e-6)})


def random_mappings(genes: Genes, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` random layer-encoding gene rows: half per-layer uniform, half contiguous runs."""
    N = genes.cm.n_layers
    rows = [rng.integers(0, genes.n_alpha, N) for _ in range(n // 2)]
    while len(rows) < n:
        k = int(rng.integers(1, 9))
        starts = np.concatenate([[0], np.sort(rng.choice(np.arange(1, N), k - 1, replace=False))])
        runs = rng.integers(0, genes.n_alpha, k)
        rows.append(runs[np.searchsorted(starts, np.arange(N), side="right") - 1])
    return np.array(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=Path, default=None, help="profile.json of DenseNet-121")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pop", type=int, default=100)
    ap.add_argument("--gens", type=int, default=400)
    ap.add_argument("--json", type=Path, default=Path("build/bench/dse.json"))
    args = ap.parse_args()
    model = zoo.cached("densenet121")
    graph = load_model(model)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "platform.txt"
        path.write_text("".join(f"edge{d:02d}, {BOARD}\n" for d in range(1, 9)))
        platform = parse_platform(path)
    profile = load_profile(args.profile) if args.profile else synthetic_profile(graph)
    timing = Timing(platform, profile)
    cm = CostModel(graph, timing)
    genes = Genes(cm)
    rng = np.random.default_rng(args.seed)

    # The cost model alone: 40,000 candidates in populations of 100.
    batches = [random_mappings(genes, rng, args.pop) for _ in range(args.gens)]
    start = time.perf_counter()
    for X in batches:
        cm.evaluate(genes.decode(X))
    model_s = time.perf_counter() - start

    # The whole search, as `autodice dse` runs it.
    front = explore(graph, timing, Settings(pop=args.pop, gens=args.gens, seed=args.seed))
    start = time.perf_counter()
    for p in front.points:
        verify_point(graph, platform, timing, p)
    verify_s = time.perf_counter() - start

    F = np.array([[-p.cost.throughput, p.cost.max_energy_j, p.cost.max_memory / 1e6]
                  for p in front.points])
    R, G = objectives(cm.evaluate(genes.decode(random_mappings(genes, rng, 1000))))
    feasible = (G <= 0).all(axis=1)
    weakly = np.array([np.all(F <= r, axis=1).any() for r in R])
    strictly = np.array([(np.all(F <= r, axis=1) & np.any(F < r, axis=1)).any() for r in R])
    best = max(front.points, key=lambda p: p.cost.throughput)
    refs = {p.name: p for p in front.references}
    result = {
        "benchmark": "dse", "model": "densenet121", "nodes": len(graph.nodes),
        "genes": cm.n_layers, "resources": genes.n_alpha, "devices": len(platform.devices),
        "profile": str(args.profile) if args.profile else "synthetic (FLOPs)",
        "pop": args.pop, "gens": args.gens, "seed": args.seed,
        "evaluations": front.evaluations, "search_s": round(front.seconds, 3),
        "goal_s": GOAL_S, "cost_model_only_s": round(model_s, 3),
        "cost_model_evaluations": args.pop * args.gens,
        "front_points": len(front.points), "verify_s": round(verify_s, 3),
        "random_mappings": len(R), "random_feasible": int(feasible.sum()),
        "dominated_weakly": float(weakly.mean()), "dominated_strictly": float(strictly.mean()),
        "best_fps": round(best.cost.throughput, 3),
        "best_random_fps": round(float(-R[:, 0].min()), 3),
        "reference_fps": {k: round(p.cost.throughput, 3) for k, p in refs.items()},
    }
    print(f"DenseNet-121: {len(graph.nodes)} nodes, {cm.n_layers} genes, {genes.n_alpha} "
          f"resources on {len(platform.devices)} devices; profile: {result['profile']}")
    print(f"{'what':<44} {'value':>12} {'goal':>8}")
    print(f"{'NSGA-II search, ' + str(front.evaluations) + ' evaluations (s)':<44} "
          f"{front.seconds:>12.2f} {GOAL_S:>8.0f}")
    print(f"{'cost model alone, ' + str(args.pop * args.gens) + ' candidates (s)':<44} "
          f"{model_s:>12.2f} {'':>8}")
    print(f"{'split passes on ' + str(len(front.points)) + ' front points (s)':<44} "
          f"{verify_s:>12.2f} {'':>8}")
    print(f"{'random valid mappings dominated (weakly)':<44} {weakly.mean():>12.1%} "
          f"{'100%':>8}")
    print(f"{'random valid mappings dominated (strictly)':<44} {strictly.mean():>12.1%} {'':>8}")
    print(f"{'best front / best random / 1-device CPU fps':<44} "
          f"{best.cost.throughput:>5.1f} / {-R[:, 0].min():.1f} / "
          f"{refs['1-device CPU'].cost.throughput:.1f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
