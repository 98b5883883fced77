"""Where does the best mapping change as the network gets slower or faster?

    python dse/bandwidth_sweep.py                 # DenseNet-121 on specs/boards
    python dse/bandwidth_sweep.py --fast          # SqueezeNet, fewer rates (what CI runs)

One profile (measured once on this machine's ncnn), then for each link rate the boards'
``bandwidth`` is set to it and NSGA-II searches for throughput alone, as long as
``pareto_search.py`` searches (the API's defaults: --pop 100 --gens 400); the fastest mapping's
boards, ranks and cut bytes per frame show when splitting across boards stops paying. Each rate
also shows the best one-device reference (every layer on one board): the search's answer is
never below it when that board can hold the model, else the line says why. Writes a table to
stdout, ``sweep.json`` and ``sweep.png`` to --out.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import autodice
from autodice.dse.settings import Settings
from autodice.frontend import zoo

ROOT = Path(__file__).resolve().parent.parent
RATES = ("10mbit", "100mbit", "1gbit", "10gbit")


def with_bandwidth(platform: Path, rate: str, dest: Path) -> Path:
    """A copy of ``platform`` whose every board states ``bandwidth=rate``."""
    lines = []
    for line in platform.read_text().splitlines():
        body, _, comment = line.partition("#")
        if body.strip():
            body = re.sub(r",\s*bandwidth=[^,]*", "", body.rstrip()) + f", bandwidth={rate}"
        lines.append(body + (f"#{comment}" if comment else ""))
    dest.write_text("\n".join(lines) + "\n")
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="ONNX model (default: the zoo's DenseNet-121)")
    ap.add_argument("--platform", type=Path, default=ROOT / "specs" / "boards" / "platform.txt")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "dse" / "sweep")
    ap.add_argument("--rates", default=",".join(RATES))
    ap.add_argument("--pop", type=int, default=Settings.pop)
    ap.add_argument("--gens", type=int, default=Settings.gens)
    ap.add_argument("--fast", action="store_true", help="SqueezeNet, two rates, a short search.")
    args = ap.parse_args(argv)
    name = "squeezenet" if args.fast else "densenet121"
    rates = ("10mbit", "10gbit") if args.fast else tuple(args.rates.split(","))
    pop, gens = (16, 8) if args.fast else (args.pop, args.gens)
    args.out.mkdir(parents=True, exist_ok=True)
    model = Path(args.model) if args.model else args.out / f"{name}.onnx"
    if not model.exists():
        zoo.save(zoo.materialize(name, seed=0), model)

    profile = autodice.profile(model, args.platform, runs=3 if args.fast else 15)
    rows = []
    for rate in rates:
        platform = with_bandwidth(args.platform, rate, args.out / f"platform-{rate}.txt")
        front = autodice.search(model, platform, profile, objectives=("throughput",), pop=pop,
                                gens=gens)
        best = front.points[0]
        alone = max(front.references, key=lambda p: p.cost.throughput)
        the_plan = autodice.plan(model, best.mapping, platform)
        cut = sum(e.nbytes * len(e.dst) for e in the_plan.edges
                  if len({the_plan.ranks[d].host for d in e.dst} - {the_plan.ranks[e.src].host}))
        rows.append({"bandwidth": rate, "throughput_fps": best.cost.throughput,
                     "boards": len(the_plan.hosts()), "ranks": len(best.mapping),
                     "bytes_between_boards": cut, "bottleneck": best.cost.bottleneck,
                     "one_device_fps": alone.cost.throughput,
                     "one_device_fits": not alone.cost.over_capacity, "mapping": best.mapping})
        print(f"{rate:>8}: {best.cost.throughput:8.2f} frames/s on {rows[-1]['boards']} board(s), "
              f"{rows[-1]['ranks']} rank(s), {cut / 1e3:9.1f} KB/frame between boards "
              f"(bottleneck: {best.cost.bottleneck}); one device alone: "
              f"{alone.cost.throughput:.2f} frames/s"
              + ("" if not alone.cost.over_capacity else
                 f", but {'; '.join(alone.cost.over_capacity)}"))
        if best.cost.throughput < alone.cost.throughput and not alone.cost.over_capacity:
            print(f"{rate:>8}: the search ended below one device alone: give it more "
                  f"--gens (or --pop)", file=sys.stderr)
    (args.out / "sweep.json").write_text(json.dumps(rows, indent=1) + "\n")
    plot(rows, args.out / "sweep.png", model.name)
    print(f"wrote {args.out / 'sweep.json'} and {args.out / 'sweep.png'}")
    return 0


def plot(rows: list[dict], path: Path, model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    x = range(len(rows))
    ax.plot(x, [r["throughput_fps"] for r in rows], "o-", label="frames/s (best mapping)")
    for i, r in zip(x, rows):
        ax.annotate(f"{r['boards']} board(s)", (i, r["throughput_fps"]),
                    textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    ax.margins(x=0.12, y=0.2)
    ax.set_xticks(list(x), [r["bandwidth"] for r in rows])
    ax.set_xlabel("link rate of every board")
    ax.set_ylabel("predicted frames/s")
    ax.set_title(f"{model}: the fastest mapping per link rate")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
