"""Horizontal and data parallelism against vertical only, measured side by side in one run.

    python bench/parallel_bench.py [--rounds 3] [--frames 12] [--skip-dse]

(a) VGG-19's per-rank peak memory (peak RSS from stats.json, and the plan's table) with its
    fully connected layers split by channels over 4 keys, against the same conv stages with the
    FC layers vertical. Goal: the largest rank <= 35 % of the whole model's weights.
(b) A 3-stage ResNet-50 pipeline (a light stem, the heavy body, a light head) with the body
    copied onto a second core, against none. Goal >= 1.6x frames/s with enough cores; here:
    this machine's cores, stated.
(c) ResNet-50's early conv block (stem .. first bottleneck) split by rows over 2 keys against 1
    key: frames/s and the halo bytes the bands exchange.
(d) The DSE's front with all three kinds (``--parallel data,horizontal``) against vertical only
    on DenseNet-121 and VGG-19 over 4 boards (specs/boards): best predicted frames/s and least
    predicted max memory per board.

Rounds visit the configurations in turn (medians over rounds); writes build/bench/parallel.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

import autodice
from autodice.backend.build import build
from autodice.backend.gen import gen
from autodice.backend.run import run
from autodice.core.mapping import mapping_json
from autodice.core.model import load_model
from autodice.core.plan import load_plan
from autodice.frontend import zoo
from autodice.frontend.check import compare_with_model
from autodice.frontend.layers import layer_table
from autodice.frontend.split import split

ROOT = Path(__file__).resolve().parent.parent
CORES = len(os.sched_getaffinity(0))
PLATFORM = f"edge01, x86, slots=0-{max(CORES - 1, 0)}\n"


def layers_of(model: Path) -> list[str]:
    return [r["name"] for r in layer_table(load_model(model)) if not r["follows"]]


def prepare(model: Path, mapping: dict, work: Path) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    (work / "platform.txt").write_text(PLATFORM)
    (work / "mapping.json").write_text(mapping_json(mapping))
    split(model, work / "mapping.json", work / "platform.txt", work / "out")
    gen(work / "out", precision="fp32")
    build(work / "out")
    return work / "out"


def measure(outs: dict[str, Path], model: Path, frames: int, rounds: int) -> dict[str, list]:
    """Every configuration once per round, round after round: stats.json of each run. The
    first round's outputs must equal onnxruntime's (a fast wrong answer is not measured)."""
    graph = load_model(model)
    x = np.random.default_rng(0).standard_normal(graph.types[graph.inputs[0]].shape)
    x = x.astype(np.float32)
    path = next(iter(outs.values())).parent / "x.npy"
    np.save(path, x)
    got: dict[str, list] = {k: [] for k in outs}
    for r in range(rounds):
        for name, out in outs.items():
            done = run(out, {graph.inputs[0]: path}, frames=frames)
            if r == 0:
                for d in compare_with_model(load_plan(out), out, {graph.inputs[0]: x},
                                            done.outputs):
                    if d.rel > 1e-3:
                        raise SystemExit(f"{name}: {d.name} differs from onnxruntime by "
                                         f"{d.rel:.2g} (relative)")
            got[name].append(done.stats)
    return got


def vgg_memory(work: Path, frames: int) -> dict:
    """(a): FC layers vertical on one rank, or split by channels over all four."""
    model = work / "vgg19.onnx"
    zoo.save(zoo.materialize("vgg19", seed=0), model)
    names = layers_of(model)
    graph = load_model(model)
    fc = [n for n in names if graph.nodes[graph.index[n]].op_type == "Gemm"]
    convs = [n for n in names if n not in fc]
    keys = ["edge01_x860", "edge01_x861", "edge01_x862", "edge01_x863"]
    quarter = len(convs) // 4
    stages = [convs[k * quarter:(k + 1) * quarter if k < 3 else len(convs)] for k in range(4)]
    vertical = {k: s for k, s in zip(keys, stages)}
    vertical[keys[3]] = vertical[keys[3]] + fc
    split_fc = {k: s + fc for k, s in zip(keys, stages)}
    global PLATFORM
    saved, PLATFORM = PLATFORM, "edge01, x86, slots=0-3\n"  # four ranks; oversubscribed here
    try:
        outs = {"vertical": prepare(model, vertical, work / "vgg-vertical"),
                "fc split by channels": prepare(model, split_fc, work / "vgg-split")}
    finally:
        PLATFORM = saved
    weights = sum(t.nbytes for t in graph.tensors.values())
    stats = measure(outs, model, frames, 1)
    rows = {}
    for name, out in outs.items():
        plan = json.loads((out / "plan.json").read_text())
        rss = [r["peak_rss"] for r in stats[name][0]["ranks"]]
        params = [r["memory"]["params"] for r in plan["ranks"]]
        rows[name] = {"peak_rss_mb": [round(v / 1e6, 1) for v in rss],
                      "params_mb": [round(v / 1e6, 1) for v in params],
                      "largest_params_share": max(params) / weights,
                      "largest_rss_share": max(rss) / weights}
    return {"weights_mb": weights / 1e6, "rows": rows}


def resnet_pipeline(work: Path, frames: int, rounds: int) -> dict:
    """(b): stem / body / head, the body alone or with a copy on another core."""
    model = work / "resnet50.onnx"
    zoo.save(zoo.materialize("resnet50", seed=0), model)
    names = layers_of(model)
    stem, body, head = names[:4], names[4:-3], names[-3:]
    plain = {"edge01_x860": stem, "edge01_x861": body, "edge01_x862": head}
    copied = {**plain, "edge01_x863": {"replicates": "edge01_x861"}}
    global PLATFORM
    saved, PLATFORM = PLATFORM, "edge01, x86, slots=0-3\n"
    try:
        outs = {"body alone": prepare(model, plain, work / "pipe-plain"),
                "body + 1 copy": prepare(model, copied, work / "pipe-copy")}
    finally:
        PLATFORM = saved
    stats = measure(outs, model, frames, rounds)
    fps = {k: statistics.median(s["fps"] for s in v) for k, v in stats.items()}
    return {"fps": fps, "ratio": fps["body + 1 copy"] / fps["body alone"], "cores": CORES}


def early_block_rows(work: Path, frames: int, rounds: int) -> dict:
    """(c): ResNet-50's stem and first bottleneck alone, on 1 key or split by rows over 2."""
    full = work / "resnet50.onnx"
    graph = load_model(full)
    names = layers_of(full)
    block = names[:16]  # stem conv, bn, relu, pool and the first bottleneck
    last = graph.nodes[graph.index[block[-1]]].output[0]
    model = work / "resnet50-block.onnx"
    onnx.utils.extract_model(str(full), str(model), [graph.inputs[0]], [last])
    one = {"edge01_x860": layers_of(model)}
    two = {k: [{"layer": n, "split": "rows"} for n in layers_of(model)]
           for k in ("edge01_x860", "edge01_x861")}
    outs = {"1 key": prepare(model, one, work / "block-1"),
            "rows over 2 keys": prepare(model, two, work / "block-2")}
    stats = measure(outs, model, frames, rounds)
    plan = json.loads((outs["rows over 2 keys"] / "plan.json").read_text())
    halo = sum(e["bytes"] * len(e["to"]) for e in plan["edges"])
    fps = {k: statistics.median(s["fps"] for s in v) for k, v in stats.items()}
    return {"fps": fps, "speedup": fps["rows over 2 keys"] / fps["1 key"],
            "bytes_between_bands_per_frame": halo, "cores": CORES}


def dse_fronts(work: Path) -> dict:
    """(d): predicted fronts, vertical only and with the other two kinds, on four boards."""
    platform = ROOT / "specs" / "boards" / "platform.txt"
    rows = {}
    for name in ("densenet121", "vgg19"):
        model = work / f"{name}.onnx"
        if not model.exists():
            zoo.save(zoo.materialize(name, seed=0), model)
        profile = autodice.profile(model, platform, runs=5, gpu=False)
        found = {}
        for label, parallel in (("vertical", ()), ("all three", ("data", "horizontal"))):
            front = autodice.search(model, platform, profile, pop=60, gens=80, parallel=parallel)
            found[label] = {"best_fps": front.points[0].cost.throughput,
                            "least_max_memory_mb": min(p.cost.max_memory
                                                       for p in front.points) / 1e6,
                            "points": len(front.points),
                            "with_copies_or_splits": sum(p.proposed for p in front.points)}
        rows[name] = found
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--frames", type=int, default=12)
    ap.add_argument("--skip-dse", action="store_true")
    ap.add_argument("--json", type=Path, default=ROOT / "build" / "bench" / "parallel.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        result = {"cores": CORES, "vgg_memory": vgg_memory(work, 2),
                  "pipeline": resnet_pipeline(work, args.frames, args.rounds),
                  "rows": early_block_rows(work, args.frames * 4, args.rounds)}
        if not args.skip_dse:
            result["dse"] = dse_fronts(work)
    v = result["vgg_memory"]
    print(f"(a) VGG-19, {v['weights_mb']:.0f} MB of weights, 4 ranks:")
    for name, r in v["rows"].items():
        print(f"    {name:<22} params per rank {r['params_mb']} MB, peak RSS {r['peak_rss_mb']} "
              f"MB; largest rank {r['largest_params_share']:.0%} of the weights "
              f"({r['largest_rss_share']:.0%} in RSS)   goal <= 35 %")
    p = result["pipeline"]
    print(f"(b) ResNet-50 stem/body/head: {p['fps']['body alone']:.2f} -> "
          f"{p['fps']['body + 1 copy']:.2f} frames/s with the body copied: x{p['ratio']:.2f} "
          f"on {CORES} cores   goal >= 1.6 with enough cores")
    r = result["rows"]
    print(f"(c) ResNet-50 early block: {r['fps']['1 key']:.1f} -> "
          f"{r['fps']['rows over 2 keys']:.1f} frames/s split by rows over 2 keys "
          f"(x{r['speedup']:.2f}, {r['bytes_between_bands_per_frame'] / 1e3:.0f} KB/frame "
          f"between the bands) on {CORES} cores")
    for name, found in result.get("dse", {}).items():
        a, b = found["vertical"], found["all three"]
        print(f"(d) {name}: best {a['best_fps']:.2f} -> {b['best_fps']:.2f} frames/s, least max "
              f"memory {a['least_max_memory_mb']:.0f} -> {b['least_max_memory_mb']:.0f} MB "
              f"({b['with_copies_or_splits']} of {b['points']} points use copies or splits)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
