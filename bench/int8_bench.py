"""int8 benchmark (issue 55): int8 keys against fp32 ones, side by side in one run, on this x86
machine's two cores.

    python bench/int8_bench.py [--models resnet50,squeezenet,shufflenet,ppocr_det]
                               [--frames 30] [--rounds 5]

For each model, the same mapping generated twice, ``--precision fp32`` and ``--precision int8``
(gen's default ``--keep-fp32 first,sensitive``), for 1 rank x 1 thread and for 2 ranks x 1
thread (cut by FLOPs): the program's steady frames/s (medians over rounds, every configuration
in every round, fp32 and int8 back to back), the int8/fp32 ratio paired within each round, the
models' bytes (.bin files) and the ranks' largest peak RSS. How many layers became int8 is
what gen printed.

The zoo models carry seeded weights and are calibrated on seeded noise: their figures are speed
and size only. PP-OCRv4's text detector is trained (``rapidocr-onnxruntime``), calibrated on
pages drawn as tests/test_trained_ocr.py draws them; its accuracy is that test's.

ncnn's int8 kernels are written for ARM first; on x86 (AVX2, no VNNI here) they may not be
faster, and this run says by how much. Under qemu the aarch64 board's ratio says nothing about
a board's speed (every instruction is emulated), so it is not measured here.

Writes build/bench/int8.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from autodice.backend.build import build
from autodice.backend.gen import gen
from autodice.backend.run import run
from autodice.core.mapping import mapping_json
from autodice.core.model import load_model
from autodice.frontend import zoo
from autodice.frontend.layers import layer_table
from autodice.frontend.split import split
from autodice.frontend.suggest import balanced_mapping

ROOT = Path(__file__).resolve().parent.parent
PLATFORM = "edge01, x86, slots=0-1\n"
KEYS = ["edge01_x860", "edge01_x861"]


def model_and_frames(name: str, work: Path) -> tuple[Path, dict, np.ndarray]:
    """(model, input shapes, 16 calibration frames) of a zoo model or the trained detector."""
    rng = np.random.default_rng(0)
    if name != "ppocr_det":
        path = zoo.cached(name)
        graph = load_model(path)
        shape = graph.types[graph.inputs[0]].shape
        return path, {}, rng.standard_normal((16, *shape[1:])).astype(np.float32)
    sys.path.insert(0, str(ROOT / "tests"))
    from test_trained_ocr import MODELS, as_frame, drawn_page

    path = work / "ppocr_det.onnx"
    path.write_bytes((MODELS / "ch_PP-OCRv4_det_infer.onnx").read_bytes())
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    frames = np.concatenate([as_frame(drawn_page(rng), mean, std) for _ in range(16)])
    return path, {"x": (1, 3, 320, 320)}, frames


def prepare(model: Path, shapes: dict, mapping: dict, work: Path, precision: str,
            calibration: Path) -> Path:
    work.mkdir(parents=True)
    (work / "platform.txt").write_text(PLATFORM)
    (work / "mapping.json").write_text(mapping_json(mapping))
    out = work / "out"
    split(model, work / "mapping.json", work / "platform.txt", out, shapes or None)
    gen(out, precision=precision, calibration=calibration if precision == "int8" else None,
        verify_with=calibration)
    build(out)
    return out


def one_run(out: Path, frame: Path, frames: int) -> dict:
    res = run(out, {json.loads((out / "plan.json").read_text())["model_inputs"][0]["name"]:
                    frame}, frames=frames)
    return {"fps": res.stats["steady_fps"] or res.stats["fps"],
            "peak_rss": max(r["peak_rss"] for r in res.stats["ranks"])}


def bench_model(name: str, work: Path, frames: int, rounds: int) -> dict:
    model, shapes, calib = model_and_frames(name, work)
    np.save(work / "calibration.npy", calib)
    np.save(work / "frame.npy", calib[:1])
    graph = load_model(model, shapes or None)
    layers = [r["name"] for r in layer_table(graph) if not r["follows"]]
    mappings = {"1x1": {KEYS[0]: layers}, "2x1": balanced_mapping(graph, KEYS)}
    outs = {(m, p): prepare(model, shapes, mapping, work / f"{m}-{p}", p,
                            work / "calibration.npy")
            for m, mapping in mappings.items() for p in ("fp32", "int8")}
    runs: dict = {k: [] for k in outs}
    for _ in range(rounds):
        for key, out in outs.items():
            runs[key].append(one_run(out, work / "frame.npy", frames))
    rows = {}
    for m in mappings:
        fp32, int8 = runs[(m, "fp32")], runs[(m, "int8")]
        size = {p: sum(f.stat().st_size for f in (outs[(m, p)] / "ncnn").glob("*.bin"))
                for p in ("fp32", "int8")}
        rows[m] = {
            "fps_fp32": statistics.median(r["fps"] for r in fp32),
            "fps_int8": statistics.median(r["fps"] for r in int8),
            "ratio": statistics.median(b["fps"] / a["fps"] for a, b in zip(fp32, int8)),
            "bytes_fp32": size["fp32"], "bytes_int8": size["int8"],
            "bytes_ratio": size["int8"] / size["fp32"],
            "rss_fp32": statistics.median(r["peak_rss"] for r in fp32),
            "rss_int8": statistics.median(r["peak_rss"] for r in int8),
        }
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,squeezenet,shufflenet,ppocr_det")
    ap.add_argument("--frames", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    result = {"frames": args.frames, "rounds": args.rounds, "models": {}}
    print(f"{'model':<12} {'ranks':<5} {'fp32 fps':>9} {'int8 fps':>9} {'ratio':>6} "
          f"{'fp32 MB':>8} {'int8 MB':>8} {'bytes':>6} {'fp32 RSS':>9} {'int8 RSS':>9}")
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory(prefix=f"int8-bench-{name}-") as tmp:
            rows = bench_model(name, Path(tmp), args.frames, args.rounds)
        result["models"][name] = rows
        for m, r in rows.items():
            mb = {k: r[k] / 1e6 for k in ("bytes_fp32", "bytes_int8", "rss_fp32", "rss_int8")}
            print(f"{name:<12} {m:<5} {r['fps_fp32']:9.2f} {r['fps_int8']:9.2f} "
                  f"{r['ratio']:6.2f} {mb['bytes_fp32']:8.2f} {mb['bytes_int8']:8.2f} "
                  f"{r['bytes_ratio']:6.2f} {mb['rss_fp32']:8.1f}M {mb['rss_int8']:8.1f}M",
                  flush=True)
    path = ROOT / "build" / "bench" / "int8.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
