"""Detector benchmark (issue 52, in part): what the head spends on a detector's frames beside the
pipeline.

    python bench/detect_bench.py [--rounds 9]

Side by side, in one run, medians over ``--rounds`` rounds:

- ``boxes``: :func:`~autodice.backend.session.detect.detect` on YOLO11n's output at 640
  (1 x 84 x 8400: 80 classes), two ways: ``typical`` (a trained head's scores: about 150
  candidates past ``conf`` 0.25, in clusters of overlapping boxes, as a street scene gives) and
  ``worst`` (every one of the 8400 candidates past ``conf``, spread over the image: what NMS
  costs at most). Goal: <= 1 ms a frame for the typical case.
- ``masks``: the same typical head as YOLO11n-seg's (1 x 116 x 8400: 32 mask coefficients
  after the scores, and 1 x 32 x 160 x 160 prototypes), boxes and each one's instance mask in
  a 1280x720 picture's pixels, beside the boxes alone of the same head. Goal: <= 5 ms a frame.
- ``letterbox``: a 1280x720 picture into the 640x640 input (Ultralytics' recipe), per frame.
- ``decode``: a 720p H.264 clip (encoded here first, moving shapes) decoded by PyAV, frames/s
  and the CPU seconds a frame took (this process's clock), beside the letterbox of each frame.

Writes build/bench/detect.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from autodice.backend.session.detect import Letterbox, detect, letterbox

ROOT = Path(__file__).resolve().parent.parent
CLASSES, CANDIDATES, SIDE, MASKS = 80, 8400, 640, 32


def head_output(rng, kind: str) -> np.ndarray:
    """(1, 4 + 80, 8400) as a YOLO11n head gives it."""
    out = np.zeros((1, 4 + CLASSES, CANDIDATES), np.float32)
    centres = rng.uniform(0, SIDE, (CANDIDATES, 2))
    sizes = rng.uniform(8, 200, (CANDIDATES, 2))
    out[0, :2], out[0, 2:4] = centres.T, sizes.T
    out[0, 4:] = rng.uniform(0, 0.05, (CLASSES, CANDIDATES))  # most anchors see nothing
    if kind == "worst":
        out[0, 4 + rng.integers(0, CLASSES, CANDIDATES), np.arange(CANDIDATES)] = \
            rng.uniform(0.3, 1.0, CANDIDATES)
    else:  # 15 objects, each seen by about 10 anchors around it
        for obj in range(15):
            cx, cy, w, h = *rng.uniform(60, SIDE - 60, 2), *rng.uniform(30, 120, 2)
            anchors = rng.choice(CANDIDATES, 10, replace=False)
            out[0, 0, anchors] = cx + rng.normal(0, 3, 10)
            out[0, 1, anchors] = cy + rng.normal(0, 3, 10)
            out[0, 2, anchors], out[0, 3, anchors] = w, h
            out[0, 4 + obj % CLASSES, anchors] = rng.uniform(0.3, 0.95, 10)
    return out


def median_ms(fn, rounds: int, repeat: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        times.append((time.perf_counter() - t0) / repeat * 1e3)
    return statistics.median(times)


def clip_720p(path: Path, frames: int = 90) -> None:
    import av

    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = 1280, 720, "yuv420p"
        yy, xx = np.mgrid[0:720, 0:1280]
        for i in range(frames):
            img = np.stack([(xx + 4 * i) % 256, (yy + 2 * i) % 256,
                            np.full_like(xx, 90)], axis=2).astype(np.uint8)
            img[200:400, 100 + 8 * i:300 + 8 * i] = (230, 30, 30)
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def decode_rate(path: Path) -> tuple[float, float, float]:
    """(frames/s, CPU ms a frame, letterbox ms a frame) of decoding ``path`` and letterboxing
    each frame as a session does (FFmpeg scales it as it makes it RGB)."""
    import av

    wall, cpu, boxing, n = time.perf_counter(), time.process_time(), 0.0, 0
    with av.open(str(path)) as clip:
        clip.streams.video[0].thread_type = "AUTO"
        for frame in clip.decode(video=0):
            t = time.perf_counter()
            letterbox(frame, (1, 3, SIDE, SIDE))
            boxing += time.perf_counter() - t
            n += 1
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return n / (wall - boxing), 1e3 * cpu / n, 1e3 * boxing / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    out = {}
    for kind in ("typical", "worst"):
        y = head_output(rng, kind)
        kept = len(detect(y))
        out[f"boxes_{kind}_ms"] = median_ms(lambda: detect(y), args.rounds,
                                            50 if kind == "typical" else 2)
        out[f"boxes_{kind}_kept"] = kept
    y = head_output(np.random.default_rng(1), "typical")
    seg = np.concatenate([y, rng.normal(0, 1, (1, MASKS, CANDIDATES)).astype(np.float32)], 1)
    protos = rng.normal(0, 1, (1, MASKS, SIDE // 4, SIDE // 4)).astype(np.float32)
    box = Letterbox.fit((1280, 720), (SIDE, SIDE))
    out["masks_kept"] = len(detect(seg, box=box, protos=protos))
    out["masks_boxes_only_ms"] = median_ms(lambda: detect(y, box=box), args.rounds, 20)
    out["masks_ms"] = median_ms(lambda: detect(seg, box=box, protos=protos), args.rounds, 5)
    from PIL import Image

    picture = Image.fromarray(rng.integers(0, 255, (720, 1280, 3), dtype=np.uint8))
    out["letterbox_720p_ms"] = median_ms(lambda: letterbox(picture, (1, 3, SIDE, SIDE)),
                                         args.rounds, 10)
    work = ROOT / "build" / "bench"
    work.mkdir(parents=True, exist_ok=True)
    clip_720p(work / "clip720p.mp4")
    rates = [decode_rate(work / "clip720p.mp4") for _ in range(3)]
    out["decode_720p_fps"] = statistics.median(r[0] for r in rates)
    out["decode_720p_cpu_ms"] = statistics.median(r[1] for r in rates)
    out["decode_letterbox_ms"] = statistics.median(r[2] for r in rates)
    print(f"{'what':<34} {'median':>10}")
    print(f"{'boxes, typical (ms a frame)':<34} {out['boxes_typical_ms']:10.3f}   "
          f"({out['boxes_typical_kept']} boxes kept; goal <= 1 ms)")
    print(f"{'boxes, every candidate (ms)':<34} {out['boxes_worst_ms']:10.3f}   "
          f"({out['boxes_worst_kept']} boxes kept)")
    print(f"{'boxes and masks, 720p (ms a frame)':<34} {out['masks_ms']:10.3f}   "
          f"({out['masks_kept']} masks; the boxes alone {out['masks_boxes_only_ms']:.3f} ms, "
          f"x{out['masks_ms'] / out['masks_boxes_only_ms']:.1f}; goal <= 5 ms)")
    print(f"{'letterbox 1280x720 -> 640 (ms)':<34} {out['letterbox_720p_ms']:10.3f}   "
          f"(a picture; a video frame: {out['decode_letterbox_ms']:.3f})")
    print(f"{'decode 720p H.264 (frames/s)':<34} {out['decode_720p_fps']:10.1f}   "
          f"({out['decode_720p_cpu_ms']:.2f} CPU ms a frame with its letterbox)")
    (work / "detect.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {work / 'detect.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
