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
from pathlib import Path

from PIL import Image

import autodice
from autodice.core.mapping import mapping_json
from autodice.core.model import load_model
from autodice.core.spec import parse_platform
from autodice.deploy.emulated import cluster
from autodice.frontend import zoo
from autodice.frontend.suggest import balanced_mapping

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = "classify-example"  # its own emulated cluster: a user's stays as it is


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
    names = autodice.read_labels(args.labels, plan) if args.labels else None
    images = sorted(p for p in args.images.iterdir()
                    if p.suffix.lower() in Image.registered_extensions())

    inventory, emulated = args.inventory, args.inventory is None
    if emulated:
        inventory = args.work / "inventory.toml"
        cluster.up([b.name for b in boards], "1gbit", inventory=inventory, name=CLUSTER,
                   replace=True)
    try:
        print(f"deploying to {' and '.join(b.name for b in boards)} "
              f"({'emulated here' if emulated else inventory}), starting the job", flush=True)
        with autodice.open(out, inventory=inventory, preprocess=args.preprocess) as session:
            # Paths go in as they are: the session decodes and preprocesses each image.
            for path, result in zip(images, session.map(images)):
                if isinstance(result, autodice.FrameError):
                    print(f"{path.name}: {result}")
                elif names is None:
                    flat = result.reshape(-1)
                    print(f"{path.name}: class {int(flat.argmax())} ({float(flat.max()):.3g})")
                else:
                    (name, score), = autodice.top_k(result, names, 1)
                    print(f"{path.name}: {name} ({score:.3g})")
        stats = session.stats()
    finally:
        if emulated:
            cluster.down(CLUSTER)
    lat = stats["latency_s"]
    print(f"{stats['frames']} of {len(images)} images on {' + '.join(keys)}: {stats['fps']:.1f} "
          f"images/s, latency p50 {lat['p50'] * 1e3:.1f} ms, p99 {lat['p99'] * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    from refusals import run  # beside this script

    run(main)
