"""Does the front hold on the boards? Search, then run front points for real on a cluster.

    sudo python dse/measure_front.py                      # emulated 4-board cluster, DenseNet-121
    sudo python dse/measure_front.py --fast               # 2 boards, SqueezeNet (what CI runs)
    python dse/measure_front.py -i inventory.toml         # your own boards (no root needed)

Without --inventory an emulated cluster is started here (`autodice cluster up`: one network
namespace, sshd and 1 Gbit/s link per board; needs root) and taken down at the end. The model is
profiled, the links between the boards measured, NSGA-II searches, and --points front points
are deployed and run over ssh in interleaved rounds; the table compares predicted and measured
frames/s and memory (also in OUT/measure.json).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import autodice
from autodice.deploy.emulated import cluster
from autodice.dse.measure import measure
from autodice.frontend import zoo

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = "dse-measure"  # its own emulated cluster: a user's stays as it is


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="ONNX model (default: the zoo's DenseNet-121)")
    ap.add_argument("--platform", type=Path, default=ROOT / "specs" / "boards" / "platform.txt")
    ap.add_argument("--inventory", "-i", type=Path, default=None,
                    help="Real boards (inventory.toml); default: an emulated cluster here.")
    ap.add_argument("--points", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "dse" / "measured")
    ap.add_argument("--fast", action="store_true",
                    help="SqueezeNet on two boards, a short search, few frames.")
    args = ap.parse_args(argv)
    name = "squeezenet" if args.fast else "densenet121"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    model = Path(args.model) if args.model else args.out.parent / f"{name}.onnx"
    if not model.exists():
        zoo.save(zoo.materialize(name, seed=0), model)
    platform = args.platform
    if args.fast:  # the first two boards only
        lines = [ln for ln in platform.read_text().splitlines() if ln and not ln.startswith("#")]
        platform = args.out.parent / "two-boards.txt"
        platform.write_text("\n".join(lines[:2]) + "\n")
    hosts = [ln.split(",")[0].strip() for ln in platform.read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]

    inventory, emulated = args.inventory, args.inventory is None
    if emulated:
        # The emulated hosts are this machine's kind, whatever the boards are: "cpu" says so
        # (deploy refuses a host that is not what the platform file says).
        lines = [ln.split(",", 2) for ln in platform.read_text().splitlines()
                 if ln.strip() and not ln.startswith("#")]
        platform = args.out.parent / "emulated-boards.txt"
        platform.write_text("".join(f"{p[0]}, cpu,{p[2]}\n" for p in lines))
        inventory = args.out.parent / "inventory.toml"
        cluster.up(hosts, "1gbit", inventory=inventory, name=CLUSTER, replace=True)
    try:
        profile = autodice.profile(model, platform, runs=3 if args.fast else 15,
                                   inventory=inventory)
        autodice.search(model, platform, profile, pop=16 if args.fast else 100,
                        gens=8 if args.fast else 400, out=args.out)
        results = measure(args.out, model, platform, profile, args.points,
                          frames=5 if args.fast else 100, rounds=2 if args.fast else 5,
                          inventory=inventory)
    finally:
        if emulated:
            cluster.down(CLUSTER)
    print(f"{'point':>6} {'predicted fps':>14} {'measured fps':>13} {'error':>7} "
          f"{'memory error':>13}  notes")
    for m in results:  # the notes say what made a run unlike the boards' (lavapipe, ...)
        print(f"{m.point:>6} {m.predicted_fps:14.2f} {m.measured_fps:13.2f} {m.fps_error:7.0%} "
              f"{m.memory_error:13.0%}  {'; '.join(m.notes)}")
    print(f"measured on {'the emulated cluster' if emulated else inventory}; "
          f"details in {args.out / 'measure.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
