"""GPU ranks on a real GPU: a model on one rank of the CPU's cores, on one GPU rank (``auto``
precision: fp16 where the values fit, and fp32), and cut in two by measured time between the CPU
rank and the GPU rank; each run under mpirun as ``autodice run`` runs it and checked against
onnxruntime. The GPU rank alone is fed distinct frames through a session too (``autodice.open``:
the gateway, the shared slots the GPU rank reads its input from), against the program's own
repeat of one frame.

    python bench/gpu_bench.py [--models squeezenet,resnet50] [--frames 200] [--rounds 3]
                              [--cores 8] [--json build/bench/gpu.json]

CI has no GPU: there the GPU path runs on Mesa's lavapipe (Vulkan on the CPU) in tests/test_gpu.py,
whose speed is not a GPU's. This bench is for a machine with one (on lavapipe it runs too, slowly,
and says which device each rank used). The CPU rank has ``--cores`` cores (default: all but one,
at most 8); the GPU rank's host thread gets the next core, so the two never share one.

Every configuration runs once per round, round after round, so drift hits all alike; the table
shows medians over rounds, and the ratios are taken within each round, their median reported.
The two-rank cut is ``autodice layers --balance``'s, fed a profile measured here with the GPU
(every layer timed on the CPU at 1 and ``--cores`` threads and on the GPU, with its copies); the
JSON keeps that profile's layer times and the cut's predicted stage times beside the measured.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

import autodice
from autodice.backend.build import build
from autodice.backend.gen import gen
from autodice.backend.run import run
from autodice.core.mapping import mapping_json, parse_keys
from autodice.core.model import load_model
from autodice.dse.balance import balance, key_platform
from autodice.dse.profiler import run_profile
from autodice.frontend import zoo
from autodice.frontend.check import compare
from autodice.frontend.layers import layer_table
from autodice.frontend.split import split

ROOT = Path(__file__).resolve().parent.parent


def configurations(model: Path, cores: int) -> tuple[dict, dict]:
    """name -> (mapping, precision): the CPU rank alone, the GPU rank alone (auto and fp32),
    and the two cut where the slower one is fastest by the GPU profile measured here; and what
    that profile and cut say (whole-model and summed layer times, each stage's prediction)."""
    graph = load_model(model)
    layers = [r["name"] for r in layer_table(graph) if not r["follows"]]
    cpu = f"edge01_cpu0-{cores - 1}" if cores > 1 else "edge01_cpu0"
    keys = [cpu, "edge01_gpu"]
    platform = key_platform(parse_keys(keys, "gpu_bench"))
    measured = run_profile(model, platform, tuple(sorted({1, cores})), gpu=True)
    cut = balance(graph, model, keys, measured.profile)
    said = {"whole_ms": {str(k): v for k, v in measured.whole_ms.items()},
            "layers_ms": {str(cores): sum(c.cpu_ms[cores] for c in measured.profile.layers)},
            "cut_predicted_ms": {k: 1e3 * v for k, v in cut.seconds.items()},
            "cut_notes": list(cut.notes),
            "gpu_copies": {"device": measured.profile.gpu.device,
                           "precision": measured.profile.gpu.precision,
                           **{way: {"bandwidth": link.bandwidth, "latency": link.latency}
                              for way, link in (("upload", measured.profile.gpu.upload),
                                                ("download", measured.profile.gpu.download))}},
            "layers": [[c.name, c.cpu_ms[cores], c.gpu_ms] for c in measured.profile.layers]}
    return {f"cpu 1x{cores}": ({cpu: layers}, "auto"),
            "gpu auto": ({"edge01_gpu": layers}, "auto"),
            "gpu fp32": ({"edge01_gpu": layers}, "fp32"),
            "cpu+gpu": (cut.mapping, "auto")}, said


def prepare(model: Path, mapping: dict[str, list[str]], precision: str, cores: int,
            work: Path) -> Path:
    """Split, generate and build one configuration, as the CLI's split, gen and build do."""
    work.mkdir(parents=True, exist_ok=True)
    # The GPU rank's host thread takes the lowest core no CPU key claims: core ``cores``.
    (work / "platform.txt").write_text(
        f"edge01, x86, slots=0-{cores}, gpu=GPU (VULKAN)\n")
    (work / "mapping.json").write_text(mapping_json(mapping))
    out = work / "out"
    split(model, work / "mapping.json", work / "platform.txt", out)
    gen(out, precision=precision)
    build(out)
    return out


def bench_model(name: str, frames: int, rounds: int, cores: int, work: Path) -> dict:
    model = zoo.cached(name)
    spec = load_model(model)
    x = np.random.default_rng(0).standard_normal(spec.types[spec.inputs[0]].shape)
    x = x.astype(np.float32)
    np.save(work / f"{name}.npy", x)
    reference = ort.InferenceSession(str(model))
    want = reference.run(None, {spec.inputs[0]: x})[0]
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(x.shape).astype(np.float32) for _ in range(20)]
    wants = [reference.run(None, {spec.inputs[0]: f})[0] for f in xs]
    start = time.monotonic()
    configs, profile = configurations(model, cores)
    outs = {c: prepare(model, m, p, cores, work / name / c.replace(" ", "-").replace("+", "-"))
            for c, (m, p) in configs.items()}
    prepared_s = time.monotonic() - start
    runs: dict[str, list[dict]] = {c: [] for c in configs}
    sessions: list[dict] = []
    for _ in range(rounds):
        for c, out in outs.items():
            res = run(out, {spec.inputs[0]: work / f"{name}.npy"}, frames)
            got = next(iter(res.outputs.values()))
            runs[c].append({"fps": res.stats["fps"], "steady_fps": res.stats["steady_fps"],
                            "rel_error": compare(got, want)[1],
                            "top1_same": bool(got.argmax() == want.argmax()),
                            "ranks": [{k: r[k] for k in ("key", "device", "precision",
                                                           "compute_s", "recv_wait_s")}
                                      for r in res.stats["ranks"]]})
        sessions.append(stream(outs["gpu auto"], xs, wants, frames))
    rows = {}
    for c, rs in runs.items():
        rows[c] = {"fps": statistics.median(r["steady_fps"] for r in rs),
                   "rel_error": max(r["rel_error"] for r in rs),
                   "top1_same": all(r["top1_same"] for r in rs),
                   "devices": [f'{r["device"]} {r["precision"]}' for r in rs[-1]["ranks"]],
                   "layers": {k: len(v) for k, v in configs[c][0].items()},
                   "runs": rs}
    cpu = next(c for c in runs if c.startswith("cpu 1x"))
    for c in runs:
        rows[c]["vs_cpu"] = statistics.median(a["steady_fps"] / b["steady_fps"]
                                              for a, b in zip(runs[c], runs[cpu]))
    rows["cpu+gpu"]["vs_gpu"] = statistics.median(
        a["steady_fps"] / b["steady_fps"] for a, b in zip(runs["cpu+gpu"], runs["gpu auto"]))
    session = {"fps": statistics.median(r["steady_fps"] for r in sessions),
               "vs_repeat": statistics.median(a["steady_fps"] / b["steady_fps"]
                                              for a, b in zip(sessions, runs["gpu auto"])),
               "rel_error": max(r["rel_error"] for r in sessions),
               "frames_from_slots": min(r["frames_from_slots"] for r in sessions),
               "runs": sessions}
    return {"prepare_s": prepared_s, "configs": rows, "session": session, "profile": profile}


def stream(out: Path, xs: list[np.ndarray], wants: list[np.ndarray], frames: int) -> dict:
    """``frames`` frames (``xs`` in turn) through a session: its steady rate, its worst error
    against onnxruntime, and how many frames the first rank read from the shared slots."""
    with autodice.open(out) as s:
        got = list(s.map(itertools.islice(itertools.cycle(xs), frames)))
    st = s.stats()
    return {"steady_fps": st["steady_fps"], "frames": len(got),
            "rel_error": max(compare(g, wants[i % len(xs)])[1] for i, g in enumerate(got)),
            "frames_from_slots": st["ranks"][0]["frames_from_slots"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="squeezenet,resnet50")
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cores", type=int, default=min(8, max(1, (os.cpu_count() or 2) - 1)))
    ap.add_argument("--json", type=Path, default=ROOT / "build" / "bench" / "gpu.json")
    args = ap.parse_args()
    result = {"cores": args.cores, "frames": args.frames, "rounds": args.rounds, "models": {}}
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        for name in args.models.split(","):
            result["models"][name] = bench_model(name, args.frames, args.rounds, args.cores,
                                                 Path(tmp))
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=1) + "\n")  # each model as it ends
            print_model(name, result["models"][name])
    print(f"wrote {args.json}", file=sys.stderr)


def print_model(name: str, m: dict) -> None:
    print(f"\n{name} (split, gen, build of all four: {m['prepare_s']:.0f} s)")
    print(f"{'configuration':<14}{'frames/s':>10}{'x cpu':>8}  {'rel err':>9} top1  "
          "layers / ranks: device precision")
    for c, r in m["configs"].items():
        ranks = ", ".join(f"{n} {d}" for n, d in zip(r["layers"].values(), r["devices"]))
        print(f"{c:<14}{r['fps']:>10.1f}{r['vs_cpu']:>8.2f}  {r['rel_error']:>9.2e} "
              f"{'same' if r['top1_same'] else 'DIFF'}  {ranks}")
    print(f"cpu+gpu against the GPU alone (auto): {m['configs']['cpu+gpu']['vs_gpu']:.2f}x")
    se = m["session"]
    print(f"the GPU alone fed distinct frames by a session: {se['fps']:.1f} frames/s, "
          f"{se['vs_repeat']:.2f}x its repeat, rel err {se['rel_error']:.2e}, "
          f"{se['frames_from_slots']} frames read from the shared slots")
    p = m["profile"]
    print("profile, ms per frame: whole model " + ", ".join(
        f"{k} {v:.2f}" for k, v in p["whole_ms"].items()) + "; its CPU layers summed " + ", ".join(
        f"{k} {v:.2f}" for k, v in p["layers_ms"].items()) + "; the cut's stages predicted "
        + ", ".join(f"{k} {v:.2f}" for k, v in p["cut_predicted_ms"].items()))
    gpu = m["configs"]["gpu auto"]
    print(f"the GPU alone: the profile's whole model {p['whole_ms']['gpu']:.2f} ms "
          f"({p['gpu_copies']['precision']}), the program {1e3 / gpu['fps']:.2f} ms a frame "
          f"({gpu['devices'][0].rsplit(' ', 1)[1]})")
    for note in p["cut_notes"]:
        print(f"--balance: {note}")


if __name__ == "__main__":
    main()
