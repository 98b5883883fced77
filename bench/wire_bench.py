"""``gen --wire``: frames/s of a pipeline whose cut crosses an emulated 100 Mbit/s link, with its
cut tensors sent as fp32, fp16 and int8 (needs root: it brings up an emulated cluster of its own).

A zoo model (seeded weights: this measures speed; accuracy on trained weights is
tests/test_trained_ocr.py's and ``check --frames``'s) split over two emulated hosts, one key
each, whose links tc shapes to 100 Mbit/s both ways. Each wire format is generated and deployed
into its own remote folder once; then the three take turns, round after round, each round a
pipelined run of ``--frames`` frames, so a slow phase of this shared machine falls on all three.
Beside each: the link's ceiling (12.5 MB/s over the bytes that cross it a frame), the same plan
with every rank on this machine (no network: what converting costs where the link is not the
limit), and how far the deployed outputs are from onnxruntime's whole model.

Prints a table with medians and the ratios to fp32, writes JSON (build/bench/wire.json). Goal
(issue 55): fp16 >= 1.8x fp32's frames/s. Run as root: ``.venv/bin/python bench/wire_bench.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

import numpy as np

from autodice.backend.build import build
from autodice.backend.engine import ensure_ncnn
from autodice.backend.gen import gen
from autodice.backend.run import run
from autodice.backend.wire import WIRES, Wire
from autodice.core.mapping import mapping_json
from autodice.core.model import load_model
from autodice.core.plan import load_plan
from autodice.deploy.deploy import deploy
from autodice.deploy.emulated import cluster
from autodice.deploy.emulated.state import inventory_toml
from autodice.frontend import zoo
from autodice.frontend.check import compare_with_model
from autodice.frontend.split import split
from autodice.frontend.suggest import balanced_mapping

ROOT = Path(__file__).resolve().parent.parent
HOSTS = ["edge01", "edge02"]
CLUSTER = "wirebench"  # its own emulated cluster: a user's stays as it is
RATE = "100mbit"
RATE_BYTES = 100e6 / 8
GOAL_FP16 = 1.8


def prepare(model: Path, work: Path, c: cluster.Cluster, kind: str) -> tuple[Path, Path]:
    """Split ``model`` over the two hosts, gen with ``--wire kind``; an inventory whose remote
    folders are this format's own (so the three builds stay deployed side by side)."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "platform.txt").write_text("".join(f"{h}, x86, slots=0-1\n" for h in HOSTS))
    keys = [f"{h}_cpu{i % 2}" for i, h in enumerate(HOSTS)]
    (work / "mapping.json").write_text(mapping_json(balanced_mapping(load_model(model), keys)))
    split(model, work / "mapping.json", work / "platform.txt", work / "out")
    gen(work / "out", wire=kind)
    text = inventory_toml(c, HOSTS, ncnn_dir=ensure_ncnn())
    for h in c.hosts:
        text = text.replace(f'remote_dir = "{h.remote_dir}"',
                            f'remote_dir = "{h.remote_dir}/{kind}"')
    inventory = work / "inventory.toml"
    inventory.write_text(text)
    return work / "out", inventory


def crossing_bytes(out: Path) -> int:
    """Bytes a frame sends from one host to the other (the busier way), as the wire sends them."""
    plan, wire = load_plan(out), Wire.of_output(out)
    ways: dict[tuple[str, str], int] = {}
    for e in plan.edges:
        for d in e.dst:
            a, b = plan.ranks[e.src].host, plan.ranks[d].host
            if a != b:
                ways[a, b] = ways.get((a, b), 0) + wire.nbytes(plan, e, d)
    return max(ways.values(), default=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="squeezenet", help="Zoo model.")
    ap.add_argument("--frames", type=int, default=40, help="Frames per run.")
    ap.add_argument("--rounds", type=int, default=3, help="Rounds (the formats take turns).")
    ap.add_argument("--json", type=Path, default=ROOT / "build" / "bench" / "wire.json")
    ap.add_argument("--keep", action="store_true", help="Leave the cluster up afterwards.")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("wire_bench needs root (it brings up the emulated cluster)")
    work = ROOT / "build" / "bench" / "wire"
    shutil.rmtree(work, ignore_errors=True)
    model = zoo.cached(args.model)
    graph = load_model(model)
    x = np.random.default_rng(0).standard_normal(graph.types[graph.inputs[0]].shape
                                                 ).astype(np.float32)
    work.mkdir(parents=True)
    np.save(work / "x.npy", x)
    deployed: dict[str, list[float]] = {k: [] for k in WIRES}
    local: dict[str, list[float]] = {k: [] for k in WIRES}
    error: dict[str, float] = {}
    c = cluster.up(HOSTS, bandwidth=RATE, name=CLUSTER, replace=True)
    try:
        setups = {k: prepare(model, work / k, c, k) for k in WIRES}
        name = load_plan(setups["fp32"][0]).model_inputs[0].name
        feeds = {name: x}
        for rnd in range(args.rounds):
            for kind in WIRES[rnd % 3:] + WIRES[:rnd % 3]:  # a rotated order each round
                out, inventory = setups[kind]
                res = deploy(out, inventory, run=True, inputs={name: work / "x.npy"},
                             frames=args.frames)
                deployed[kind].append(res.run.stats["steady_fps"] or res.run.stats["fps"])
                diffs = compare_with_model(load_plan(out), out, feeds, res.run.outputs)
                error[kind] = max(d.rel for d in diffs)
                print(f"round {rnd + 1}, {kind}: {deployed[kind][-1]:.2f} frames/s deployed",
                      file=sys.stderr)
        for rnd in range(args.rounds):  # every rank here, no network
            for kind in WIRES:
                out = setups[kind][0]
                if rnd == 0:
                    build(out)
                res = run(out, {name: work / "x.npy"}, frames=args.frames,
                          results=work / kind / "local")
                local[kind].append(res.stats["steady_fps"] or res.stats["fps"])
    finally:
        if not args.keep:
            cluster.down(CLUSTER)
    rows = []
    base = statistics.median(deployed["fp32"])
    base_local = statistics.median(local["fp32"])
    for kind in WIRES:
        out = setups[kind][0]
        nbytes = crossing_bytes(out)
        fps, here = statistics.median(deployed[kind]), statistics.median(local[kind])
        rows.append({"wire": kind, "bytes_per_frame": nbytes,
                     "link_bound_fps": RATE_BYTES / nbytes, "deployed_fps": fps,
                     "deployed_rounds": deployed[kind], "vs_fp32": fps / base,
                     "local_fps": here, "local_rounds": local[kind],
                     "local_vs_fp32": here / base_local, "max_rel_error": error[kind]})
    plan = load_plan(setups["fp32"][0])
    print(f"\n{args.model} over {', '.join(HOSTS)} (keys {', '.join(r.key for r in plan.ranks)}), "
          f"links tbf {RATE} both ways, {args.frames} frames pipelined, median of "
          f"{args.rounds} rounds:")
    print(f"  {'wire':<5} {'KB/frame':>9} {'link-bound':>11} {'deployed fps':>13} {'x fp32':>7} "
          f"{'local fps':>10} {'x fp32':>7} {'rel error':>10}")
    for r in rows:
        print(f"  {r['wire']:<5} {r['bytes_per_frame'] / 1e3:>9.1f} {r['link_bound_fps']:>11.2f} "
              f"{r['deployed_fps']:>13.2f} {r['vs_fp32']:>6.2f}x {r['local_fps']:>10.2f} "
              f"{r['local_vs_fp32']:>6.2f}x {r['max_rel_error']:>10.2e}")
    fp16 = rows[1]["vs_fp32"]
    print(f"  goal: fp16 >= {GOAL_FP16}x fp32 deployed: {fp16:.2f}x "
          f"{'✔' if fp16 >= GOAL_FP16 else '✘'}")
    print("  (link-bound: 12.5 MB/s over the bytes that cross a frame; local: every rank on this "
          "machine, no network: what packing costs; rel error: max |diff| / max |onnxruntime| of "
          "the outputs, seeded weights)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "benchmark": "wire", "machine_cpus": os.cpu_count(), "load_average": os.getloadavg(),
        "model": args.model, "frames": args.frames, "rounds": args.rounds, "rate": RATE,
        "mapping": {r.key: list(r.layers) for r in plan.ranks}, "rows": rows,
        "goal_fp16_vs_fp32": GOAL_FP16, "met": fp16 >= GOAL_FP16}, indent=2) + "\n")
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
