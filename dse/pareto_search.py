"""Pareto-optimal mappings of DenseNet-121 on four boards, under a memory cap per board.

    python dse/pareto_search.py                   # DenseNet-121, specs/boards, 1 GB per board
    python dse/pareto_search.py --fast            # SqueezeNet, a short search (what CI runs)

Profiles the model on this machine's ncnn (cached after the first time), runs NSGA-II for
throughput, per-board energy and per-board memory with every board held to --max-memory, and
writes the front (pareto.csv/json/png and one mapping file per point) to --out. Then prints the
fastest point and the one with the least memory, and what each would need on the boards.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import autodice
from autodice.frontend import zoo

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="ONNX model (default: the zoo's DenseNet-121)")
    ap.add_argument("--platform", type=Path, default=ROOT / "specs" / "boards" / "platform.txt")
    ap.add_argument("--max-memory", default="1GB", help="Per board (default 1GB).")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "dse" / "pareto")
    ap.add_argument("--pop", type=int, default=100)
    ap.add_argument("--gens", type=int, default=400)
    ap.add_argument("--fast", action="store_true", help="SqueezeNet and a short search.")
    args = ap.parse_args(argv)
    name = "squeezenet" if args.fast else "densenet121"
    pop, gens = (16, 10) if args.fast else (args.pop, args.gens)
    model = Path(args.model) if args.model else args.out.parent / f"{name}.onnx"
    if not model.exists():
        model.parent.mkdir(parents=True, exist_ok=True)
        zoo.save(zoo.materialize(name, seed=0), model)

    profile = autodice.profile(model, args.platform, runs=3 if args.fast else 15)
    front = autodice.search(model, args.platform, profile, max_memory=args.max_memory, pop=pop,
                            gens=gens, out=args.out)
    print(f"{len(front.points)} Pareto points of {model.name} on {args.platform.name}, every "
          f"board under {args.max_memory}; written to {args.out}")
    fastest = front.points[0]
    leanest = min(front.points, key=lambda p: p.cost.max_memory)
    for label, p in (("fastest", fastest), ("least memory", leanest)):
        c = p.cost
        print(f"  {label:>12}: {p.name} {c.throughput:8.2f} frames/s, "
              f"{c.max_memory / 1e6:7.1f} MB on the fullest board, "
              f"{c.max_energy_j * 1e3:7.1f} mJ/frame, {len(p.mapping)} ranks "
              f"({', '.join(p.mapping)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
