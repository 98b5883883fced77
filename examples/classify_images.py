"""Classify a folder of images on two boards: the model split in two, every image streamed through.

    sudo python examples/classify_images.py IMAGES              # an emulated 2-board cluster here
    python examples/classify_images.py IMAGES -i inventory.toml # your own boards (no root needed)
    python examples/classify_images.py IMAGES --model resnet50.onnx --labels synset.txt

The model (default: the zoo's SqueezeNet with seeded weights: its classes are arbitrary, bring a
trained model for real ones) is cut into two runs of layers of about equal FLOPs, one per board
with all its cores (what `autodice layers --balance` does), split, converted to ncnn and
deployed. Then each image is decoded and preprocessed (ImageNet's recipe; --preprocess changes
it), streamed through both boards in order, and its top-1 class printed as its result comes back.

Without --inventory an emulated cluster of the platform's first two boards is started here
(`autodice cluster up`: a network namespace, sshd and 1 Gbit/s link per board; needs root) and
taken down at the end.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import autodice
from autodice.backend.frames import ImageRecipe, frames_from
from autodice.backend.session import FrameError
from autodice.backend.stream import read_labels, top_k
from autodice.core.model import load_model
from autodice.core.spec import mapping_json, parse_platform
from autodice.deploy import cluster
from autodice.frontend import zoo
from autodice.frontend.suggest import balanced_mapping

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("images", type=Path, help="A folder of images (.jpg, .png, ...).")
    ap.add_argument("--model", type=Path, default=None,
                    help="ONNX classifier (default: the zoo's SqueezeNet, seeded weights).")
    ap.add_argument("--labels", type=Path, default=None,
                    help="Class names, one a line (default: class numbers).")
    ap.add_argument("--platform", type=Path, default=ROOT / "specs" / "squeezenet" / "platform.txt",
                    help="Boards; the first two are used.")
    ap.add_argument("--inventory", "-i", type=Path, default=None,
                    help="Real boards (inventory.toml); default: an emulated cluster here.")
    ap.add_argument("--preprocess", default=None, metavar="KEY=VALUE,...",
                    help="The image recipe, as `autodice run --preprocess`.")
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "examples" / "classify")
    args = ap.parse_args(argv)

    args.work.mkdir(parents=True, exist_ok=True)
    model = args.model or args.work / "squeezenet.onnx"
    if not model.exists():
        zoo.save(zoo.materialize("squeezenet", seed=0), model)
    boards = list(parse_platform(args.platform).devices.values())[:2]
    keys = [f"{b.name}_{b.arch}{b.slots[0]}-{b.slots[-1]}" if b.slots else f"{b.name}_{b.arch}0"
            for b in boards]
    mapping = args.work / "mapping.json"
    mapping.write_text(mapping_json(balanced_mapping(load_model(model), keys)))
    platform = args.platform
    if args.inventory is None:  # the emulated boards are this machine's kind: "cpu" says so
        platform = args.work / "platform.txt"
        platform.write_text("".join(f"{b.name}, cpu, slots={b.slots[0]}-{b.slots[-1]}\n"
                                    if b.slots else f"{b.name}\n" for b in boards))
    out = args.work / "out"
    print(f"splitting {model.name} over {' and '.join(keys)}, converting to ncnn", flush=True)
    plan = autodice.split(model, mapping, platform, out)
    autodice.gen(out)
    names = read_labels(args.labels) if args.labels else None
    x = plan.model_inputs[0]
    count, images = frames_from(str(args.images), x.shape, x.dtype,
                                ImageRecipe.parse(args.preprocess))

    inventory, emulated = args.inventory, args.inventory is None
    if emulated:
        inventory = args.work / "inventory.toml"
        cluster.up([b.name for b in boards], "1gbit", inventory=inventory)
    labels: list[str] = []

    def frames():  # the images' file names, kept in order for the results
        for label, frame in images:
            labels.append(label)
            yield frame

    try:
        print(f"deploying to {' and '.join(b.name for b in boards)} "
              f"({'emulated here' if emulated else inventory}), starting the job", flush=True)
        with autodice.open(out, inventory=inventory) as session:
            for i, result in enumerate(session.map(frames())):
                # Frame i was taken (and its label kept) before its result could come back.
                if isinstance(result, FrameError):
                    print(f"{labels[i]}: {result}")
                elif names is None:
                    flat = result.reshape(-1)
                    print(f"{labels[i]}: class {int(flat.argmax())} ({float(flat.max()):.3g})")
                else:
                    (name, score), = top_k(result, names, 1)
                    print(f"{labels[i]}: {name} ({score:.3g})")
        stats = session.stats()
    finally:
        if emulated:
            cluster.down()
    lat = stats["latency_s"]
    print(f"{stats['frames']} of {count} images on {' + '.join(keys)}: {stats['fps']:.1f} "
          f"images/s, latency p50 {lat['p50'] * 1e3:.1f} ms, p99 {lat['p99'] * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
