"""Split benchmark: full-size zoo models into 24 sub-models over 8 devices.

Prints median seconds of ``autodice.split`` and, side by side in the same run, of the obvious
protobuf way (``onnx.load``, copy each sub-model's nodes and weights, ``onnx.save``), and their
ratio; writes JSON. Run: ``make bench`` (or ``python bench/split_bench.py --repeat 5``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import onnx

from autodice.core.model import load_model, name_layers
from autodice.core.plan import load_plan
from autodice.frontend import zoo
from autodice.frontend.split import split
from autodice.frontend.suggest import balanced_mapping

MODELS = ("vgg19", "densenet121", "resnet50")
TARGETS = {"vgg19": 2.0, "densenet121": 0.3}  # seconds, from issue 2 (paper: 21.5 s and 1.93 s)


def platform_and_mapping(model: Path, work: Path) -> tuple[Path, Path]:
    """8 devices x 3 resources (1 core, 3 cores, GPU) = 24 keys, layers balanced by FLOPs."""
    lines, keys = [], []
    for d in range(1, 9):
        lines.append(f"edge{d:02d}, arm, slots=0-5, gpu=NVIDIAVolta (CUDA)")
        keys += [f"edge{d:02d}_arm0", f"edge{d:02d}_arm123", f"edge{d:02d}_gpu"]
    (work / "platform.txt").write_text("\n".join(lines) + "\n")
    mapping = balanced_mapping(load_model(model), keys)
    (work / "mapping.json").write_text(json.dumps(mapping))
    return work / "platform.txt", work / "mapping.json"


def protobuf_split(model: Path, out: Path) -> None:
    """The baseline: the same sub-models through onnx's protobuf objects."""
    plan = load_plan(out)
    whole = onnx.load(str(model))
    g = whole.graph
    inits = {i.name: i for i in g.initializer}
    by_name = dict(zip(name_layers(g.node), g.node))
    for r in plan.ranks:
        sub = onnx.ModelProto()
        sub.ir_version = whole.ir_version
        sub.opset_import.extend(whole.opset_import)
        nodes = [by_name[n] for n in r.layers + r.followers]
        sub.graph.node.extend(nodes)
        sub.graph.initializer.extend(inits[t] for n in nodes for t in n.input if t in inits)
        onnx.save(sub, str(out / f"baseline_{r.rank}.onnx"))


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path, default=Path("build/bench/split.json"))
    args = ap.parse_args()
    results = []
    print(f"{'model':<12} {'nodes':>5} {'MB':>6} {'autodice s':>10} {'protobuf s':>10} "
          f"{'speed-up':>8} {'target s':>8}")
    for name in MODELS:
        model = zoo.cached(name)
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            platform, mapping = platform_and_mapping(model, work)
            ours = median_time(lambda: split(model, mapping, platform, work / "out"), args.repeat)
            base = median_time(lambda: protobuf_split(model, work / "out"),
                               max(1, args.repeat // 2))
            n_nodes = len(load_model(model).nodes)
        row = {"model": name, "nodes": n_nodes, "bytes": model.stat().st_size, "submodels": 24,
               "median_s": ours, "protobuf_median_s": base, "speedup": base / ours,
               "target_s": TARGETS.get(name)}
        results.append(row)
        target = f"{row['target_s']:.1f}" if row["target_s"] else "-"
        print(f"{name:<12} {n_nodes:>5} {row['bytes'] / 1e6:>6.0f} {ours:>10.3f} {base:>10.3f} "
              f"{base / ours:>7.1f}x {target:>8}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"benchmark": "split", "repeat": args.repeat,
                                     "results": results}, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
