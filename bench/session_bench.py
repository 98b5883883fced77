"""Session benchmark (issue 22): feeding real frames from Python against the program's own repeat.

    python bench/session_bench.py [--models squeezenet,resnet50] [--frames 60] [--rounds 3]
                                  [--long 10000]

Per model, 2 ranks x 1 thread on this machine's two cores, cut as ``autodice layers --balance``
cuts. Each round runs, side by side:

- ``repeat``: ``run --frames N`` on one frame (the program's own loop, no gateway: the ceiling);
- ``session``: N distinct frames through ``autodice.open`` (the gateway, the socket, Python);
- ``lockstep``: ``run --frames N --no-pipeline`` (one frame through every rank at a time: the
  sum of the ranks' compute and transfer times per frame, measured by the program itself);
- ``one at a time``: the session with ``window=1`` (its end-to-end latency at low load).

Goals: session >= 0.9x repeat; latency at low load <= 1.1x the lockstep frame time. Then
``--long`` distinct frames through Figure 2's three kinds of parallelism (4 ranks: a layer split
by rows, a stage with a replica): every result equal to onnxruntime on its own frame, in order,
none lost or duplicated. Writes build/bench/session.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from backend_bench import prepare  # noqa: E402
from graphs import figure2  # noqa: E402

import autodice  # noqa: E402
from autodice.backend.run import run  # noqa: E402
from autodice.core.model import load_model  # noqa: E402
from autodice.dse.balance import balance  # noqa: E402
from autodice.frontend import zoo  # noqa: E402
from autodice.frontend.check import session as ort_session  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def measure_model(name: str, work: Path, frames: int, rounds: int) -> dict:
    model = work / f"{name}.onnx"
    zoo.save(zoo.materialize(name, seed=0), model)
    graph = load_model(model)
    mapping = balance(graph, model, ["edge01_x860", "edge01_x861"]).mapping
    out = prepare(model, mapping, work / name)
    t = autodice.plan(model, mapping, work / name / "platform.txt").model_inputs[0]
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(t.shape).astype(np.float32) for _ in range(frames)]
    np.save(work / f"{name}-x.npy", xs[0])
    fps = {"repeat": [], "session": [], "lockstep": []}
    latency = []
    for _ in range(rounds):
        res = run(out, {t.name: work / f"{name}-x.npy"}, frames)
        fps["repeat"].append(res.stats["fps"])
        with autodice.open(out) as s:
            list(s.map(xs))
        fps["session"].append(s.stats()["fps"])
        res = run(out, {t.name: work / f"{name}-x.npy"}, frames, pipeline=False)
        fps["lockstep"].append(res.stats["fps"])
        with autodice.open(out, window=1) as s:
            for x in xs[: max(10, frames // 3)]:
                s.infer(x)
        latency.append(s.stats()["latency_s"]["p50"])
    med = {k: statistics.median(v) for k, v in fps.items()}
    lockstep_s = 1 / med["lockstep"]
    return {"model": name, "frames": frames, "rounds": rounds, "fps": fps,
            "latency_p50_s": latency, "median_fps": med,
            "median_latency_s": statistics.median(latency),
            "ratios": {"session / repeat": med["session"] / med["repeat"],
                       "latency / lockstep frame": statistics.median(latency) / lockstep_s}}


def long_stream(work: Path, n: int) -> dict:
    """n distinct frames through Figure 2's three kinds of parallelism, each checked."""
    d = work / "figure2"
    d.mkdir()
    shutil.copy(ROOT / "specs" / "figure2" / "platform.txt", d / "platform.txt")
    shutil.copy(ROOT / "specs" / "figure2" / "three-kinds.json", d / "mapping.json")
    onnx.save(figure2(), d / "model.onnx")
    autodice.split(d / "model.onnx", d / "mapping.json", d / "platform.txt", d / "out")
    autodice.gen(d / "out")
    autodice.build(d / "out")
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((n, 1, 4, 8, 8)).astype(np.float32)
    whole = ort_session(d / "model.onnx")
    want = [whole.run(None, {"input": x})[0] for x in xs]
    start = time.perf_counter()
    worst, count = 0.0, 0
    with autodice.open(d / "out") as s:
        for i, got in enumerate(s.map(iter(xs))):
            worst = max(worst, float(np.abs(got - want[i]).max() / np.abs(want[i]).max()))
            count += 1
    st = s.stats()
    return {"frames": n, "delivered": count, "worst_rel": worst, "fps": st["fps"],
            "seconds": time.perf_counter() - start, "latency_s": st["latency_s"],
            "ok": count == n and worst <= 1e-5}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="squeezenet,resnet50")
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--long", type=int, default=10_000)
    ap.add_argument("--json", type=Path, default=ROOT / "build" / "bench" / "session.json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="session-bench-"))
    try:
        models = [measure_model(m, work, args.frames, args.rounds)
                  for m in args.models.split(",")]
        print(f"{'model':<12}{'repeat':>10}{'session':>10}{'ratio':>8}{'lockstep ms':>13}"
              f"{'latency ms':>12}{'ratio':>8}")
        for m in models:
            med, r = m["median_fps"], m["ratios"]
            print(f"{m['model']:<12}{med['repeat']:>10.1f}{med['session']:>10.1f}"
                  f"{r['session / repeat']:>8.2f}{1e3 / med['lockstep']:>13.2f}"
                  f"{m['median_latency_s'] * 1e3:>12.2f}{r['latency / lockstep frame']:>8.2f}")
        long = long_stream(work, args.long) if args.long else None
        if long:
            print(f"figure 2, three kinds: {long['delivered']} of {long['frames']} frames in "
                  f"order, worst rel {long['worst_rel']:.2e}, {long['fps']:.0f} frames/s")
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"models": models, "long": long}, indent=1) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
