"""Video benchmark (issue 52, in part): a session fed from a video file against the same frames
fed from a ``.npy`` batch.

    python bench/video_bench.py [--rounds 5] [--frames 150] [--sides 320,640] [--no-yolo11n]

A YOLO-shaped detector (``tests/graphs.py`` ``yolo_like``: three scales, the neck's Concat, the
DFL, 80 classes; seeded weights) at each of ``--sides``, split at its neck over this machine's two
cores (2 ranks x 1 thread), and YOLO11n itself at 640 (``bench/bench_models.py``: exported with
the torch ``make fidelity`` installs, when it is there), cut where ``layers --balance`` cuts it
over the two cores. The clip is ``--frames`` frames of 720p H.264 (moving
shapes, encoded here first); the batch is the same clip decoded and letterboxed once, saved as
``(N, 1, 3, side, side)``. Each round runs, side by side in turn:

- ``video``: ``autodice.run(out, "clip.mp4", task="none")``: PyAV decodes each frame in the
  session's feeder thread and the image recipe makes it a frame; the outputs are kept as they
  are, as the batch's;
- ``batch``: ``autodice.run(out, "frames.npy")``: the frames read from the file, the same
  session;
- ``video, boxes``: the clip again with ``task="detect"``: letterboxed, and each result read
  as boxes at ``--conf`` (0.9). The head's weights are seeded, not trained: at Ultralytics'
  0.25 most of its 2,100 candidates pass, and NMS over them, not the feed, sets the pace.

Each is compared with the batch at steady state (the session's ``steady_fps``: the rate after
the first result), as the median of the rounds' ratios. Goal: ``video, boxes`` (what a user
runs: ``--task detect``, the batch's letterbox and NMS besides) >= 0.9x batch. Beside them,
``feed alone``: the clip's frames letterboxed with nothing else running (decode, the letterbox),
the most frames a second the feed can give on one core of this machine. Writes
build/bench/video.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_models import DETECTOR_SIDE, can_export, model_path  # noqa: E402
from detect_bench import clip_720p  # noqa: E402
from graphs import yolo_like  # noqa: E402

import autodice  # noqa: E402
from autodice.backend.session.detect import letterbox  # noqa: E402
from autodice.core.model import load_model  # noqa: E402
from autodice.dse.balance import balance  # noqa: E402


def detector(work: Path, side: int, name: str) -> Path:
    """yolo_like at ``side`` split at its neck, or YOLO11n cut by measured time, over two
    cores, gen'd and built."""
    keys = ["edge01_x860", "edge01_x861"]
    if name == "yolo11n":
        model = model_path(name)
        mapping = balance(load_model(model), model, keys).mapping
    else:
        model = work / "model.onnx"
        onnx.save(yolo_like(side=side, classes=80), model)
        names = load_model(model).layer_names
        cut = names.index("n3") + 1
        mapping = {keys[0]: names[:cut], keys[1]: names[cut:]}
    (work / "mapping.json").write_text(json.dumps(mapping))
    (work / "platform.txt").write_text("edge01, x86, slots=0-1\n")
    autodice.split(model, work / "mapping.json", work / "platform.txt", work / "out")
    autodice.gen(work / "out")
    autodice.build(work / "out")
    return work / "out"


def batch_of(clip: Path, side: int, into: Path) -> int:
    """The clip decoded and letterboxed as the session does it, saved as one batch."""
    import av

    with av.open(str(clip)) as video:
        frames = [letterbox(f, (1, 3, side, side))[0]
                  for f in video.decode(video=0)]
    np.save(into, np.stack(frames))
    return len(frames)


def feed_alone(clip: Path, side: int) -> float:
    """Frames a second the feed gives by itself: the clip decoded and letterboxed, as a
    detector's session's feeder makes them, with nothing else running."""
    from autodice.backend.session.frames import frames_from

    start = time.perf_counter()
    _, pairs = frames_from(str(clip), (1, 3, side, side), np.float32, None, True)
    n = sum(1 for _ in pairs)
    return n / (time.perf_counter() - start)


def measure(side: int, args, name: str = "yolo_like") -> dict:
    """One model's rounds (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="autodice-video-bench-") as tmp:
        work = Path(tmp)
        out = detector(work, side, name)
        clip_720p(work / "clip.mp4", args.frames)
        n = batch_of(work / "clip.mp4", side, work / "frames.npy")
        kinds = (("video", work / "clip.mp4", "none"), ("batch", work / "frames.npy", None),
                 ("video, boxes", work / "clip.mp4", "detect"))
        runs: dict[str, list[float]] = {kind: [] for kind, _, _ in kinds}
        runs["feed alone"] = []
        boxes = []
        for _ in range(args.rounds):
            runs["feed alone"].append(feed_alone(work / "clip.mp4", side))
            for kind, source, task in kinds:
                res = autodice.run(out, str(source), task=task, conf=args.conf)
                assert res.delivered == n and not res.errors, (kind, res.delivered, n)
                runs[kind].append(res.stats["steady_fps"])
                if task == "detect":
                    boxes.append(statistics.mean(len(r["detections"]) for r in res.records))
    ratio = {kind: statistics.median(v / b for v, b in zip(fps, runs["batch"]))
             for kind, fps in runs.items() if kind not in ("batch", "feed alone")}
    model = "YOLO11n" if name == "yolo11n" else "yolo_like"
    return {"side": side, "model": f"{model} {side}x{side}, 80 classes, 2 ranks x 1 thread",
            "frames": n, "boxes_a_frame": statistics.median(boxes), "fps": runs,
            "fps_median": {k: statistics.median(v) for k, v in runs.items()},
            "ratio_to_batch": ratio}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--frames", type=int, default=150)
    ap.add_argument("--sides", default="320,640")
    ap.add_argument("--conf", type=float, default=0.9)
    ap.add_argument("--yolo11n", action=argparse.BooleanOptionalAction, default=can_export(),
                    help="YOLO11n at 640 too (default: when make fidelity's torch is here)")
    args = ap.parse_args(argv)
    results = [measure(int(side), args) for side in args.sides.split(",") if side]
    if args.yolo11n:
        results.append(measure(DETECTOR_SIDE, args, "yolo11n"))
    print(f"{'model':<9} {'side':>5} {'source':<44} {'steady frames/s':>15} {'/ batch':>8}")
    for r in results:
        for kind, label in (("feed alone", "the clip's frames letterboxed, nothing else"),
                            ("video", "720p H.264 clip, decoded live"),
                            ("batch", "the same frames from a .npy batch"),
                            ("video, boxes", f"the clip, boxes read (conf {args.conf:g})")):
            ratio = r["ratio_to_batch"].get(kind, 1.0) if kind != "feed alone" else None
            print(f"{r['model'].split()[0]:<9} {r['side']:>5} {label:<44} "
                  f"{r['fps_median'][kind]:15.1f} "
                  + (f"{ratio:8.3f}" if ratio is not None else f"{'':>8}"))
    print(f"medians of {args.rounds} paired rounds; goal: the clip, boxes read >= 0.9x batch")
    result = {"frames": args.frames, "rounds": args.rounds, "conf": args.conf, "goal": 0.9,
              "sides": results}
    path = ROOT / "build" / "bench" / "video.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
