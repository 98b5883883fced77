"""Detect objects in a video on two boards: a YOLO model split over an x86 head and an aarch64
board, every frame streamed through, boxes drawn on an annotated copy of the video.

    sudo python examples/detect_video.py clip.mp4 --model yolov8n.onnx --labels coco.txt
    python examples/detect_video.py clip.mp4 --model yolov8n.onnx -i inventory.toml

The model is an ONNX export of an Ultralytics detector (``yolo export format=onnx``: its output
is 1 x (4 + classes) x N; YOLO26's 1 x K x 6 works too). It is cut into two runs of layers of
about equal FLOPs (what ``autodice layers --balance`` does), one per board with all its cores,
split, converted to ncnn and deployed; the aarch64 board's program is cross-built here. Each
frame of the video is decoded here (PyAV), letterboxed as Ultralytics does, streamed through
both boards in order, and its boxes come back in the video's pixels: printed a line a frame,
written to ``detections.jsonl`` and drawn into ``annotated.mp4``.

Without --inventory an emulated cluster is started here (``autodice cluster up --arch
edge02=aarch64``: edge01 this machine's kind, edge02 an aarch64 board under qemu-user, 1 Gbit/s
between them; needs root) and taken down at the end.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import av

import autodice
from autodice.backend.session.annotate import Annotator
from autodice.core.mapping import mapping_json
from autodice.core.model import load_model
from autodice.core.spec import parse_platform
from autodice.deploy.emulated import cluster
from autodice.frontend.suggest import balanced_mapping

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = "detect-example"  # its own emulated cluster: a user's stays as it is
# The emulated pair: an x86 head (this machine) and an aarch64 board, two cores each.
BOARDS = "edge01, x86, slots=0-1\nedge02, arm, slots=0-1\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("video", help="A video FFmpeg reads (a file, rtsp://..., /dev/videoN).")
    ap.add_argument("--model", type=Path, required=True, help="An Ultralytics detector, ONNX.")
    ap.add_argument("--labels", type=Path, default=None, help="Class names, one a line.")
    ap.add_argument("--conf", type=float, default=0.25, help="The least score a box keeps.")
    ap.add_argument("--platform", type=Path, default=None,
                    help="Your two boards (default: the emulated x86 head and aarch64 board).")
    ap.add_argument("--inventory", "-i", type=Path, default=None,
                    help="Real boards (inventory.toml); default: an emulated cluster here.")
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "examples" / "detect")
    args = ap.parse_args(argv)

    args.work.mkdir(parents=True, exist_ok=True)
    platform = args.platform or args.work / "platform.txt"
    if args.platform is None:
        platform.write_text(BOARDS)
    keys = ["edge01_x860-1", "edge02_arm0-1"] if args.platform is None else [
        f"{d.name}_{d.arch}{d.slots[0]}-{d.slots[-1]}"
        for d in list(parse_platform(platform).devices.values())[:2]]
    mapping = args.work / "mapping.json"
    mapping.write_text(mapping_json(balanced_mapping(load_model(args.model), keys)))
    out = args.work / "out"
    print(f"splitting {args.model.name} over {' and '.join(keys)}, converting to ncnn",
          flush=True)
    autodice.split(args.model, mapping, platform, out)
    autodice.gen(out)
    names = args.labels.read_text().splitlines() if args.labels else None

    inventory, emulated = args.inventory, args.inventory is None
    if emulated:
        inventory = args.work / "inventory.toml"
        cluster.up(["edge01", "edge02"], "1gbit", arch={"edge02": "aarch64"},
                   inventory=inventory, name=CLUSTER, replace=True)
    try:
        print(f"deploying ({'emulated here' if emulated else inventory}), starting the job",
              flush=True)
        with autodice.open(out, inventory=inventory, task="detect", conf=args.conf) as session:
            frames = annotate(args.video, session, names, args.work)
        stats = session.stats()
    finally:
        if emulated:
            cluster.down(CLUSTER)
    lat = stats["latency_s"]
    print(f"{frames} frames on {' + '.join(keys)}: {stats['fps']:.1f} frames/s, latency p50 "
          f"{lat['p50'] * 1e3:.1f} ms; {args.work / 'detections.jsonl'}, "
          f"{args.work / 'annotated.mp4'}")
    return 0


def annotate(video: str, session, names: list[str] | None, work: Path) -> int:
    """Every frame of ``video`` through ``session``: its boxes printed, written a line a frame
    and drawn into an annotated copy. Returns the frames done."""
    drawn = Annotator.of(work / "annotated.mp4", video, names)
    with av.open(video) as clip, open(work / "detections.jsonl", "w") as lines:
        pictures = clip.decode(video=0)  # PyAV's frames: the session scales them in FFmpeg
        kept: list = []  # each picture until its boxes come back: the session keeps the order

        def remembered():
            for picture in pictures:
                kept.append(picture)
                yield picture

        n = 0
        for n, boxes in enumerate(session.map(remembered()), start=1):
            picture = kept.pop(0)
            if isinstance(boxes, autodice.FrameError):
                print(f"{n - 1}: {boxes}")
                continue
            found = [d.as_json(names) for d in boxes]
            lines.write(json.dumps({"frame": n - 1, "detections": found}) + "\n")
            print(f"{n - 1}: {len(found)} boxes" + "".join(
                f", {d.get('label', d['class'])} {d['score']:.2f}" for d in found[:3]))
            drawn.add(n - 1, str(n - 1), picture, boxes)
    drawn.close()
    return n


if __name__ == "__main__":
    from refusals import run  # beside this script

    run(main)
