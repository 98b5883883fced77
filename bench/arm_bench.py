"""ARM benchmark on the emulated cluster (issue 21, needs root): an x86 host and an aarch64 board.

    .venv/bin/python bench/arm_bench.py [--rounds 5] [--frames 5] [--ncnn]

- **qemu's cost**: the whole SqueezeNet as one rank, once on edge01 (x86, this machine's CPU)
  and once on edge02 (aarch64 under qemu-user), rounds interleaved; per frame the rank's own
  compute time from stats.json (load and transfer apart). The ratio is what docs/boards.md
  calls the emulation's slowdown. It compares ncnn's x86 kernels with its aarch64 NEON kernels
  translated by qemu: a real board's figure is its own.
- **redeploy, nothing changed**: SqueezeNet in two halves over edge01 and edge02 (the board's
  program cross-built here), deployed once, then again with nothing changed: median seconds of
  the whole ``deploy()``. Goal: <= 1.0 s for 2 hosts, as on x86 hosts.
- ``--ncnn``: ncnn built from the pinned source package into an empty cache twice, side by
  side: for aarch64 with the cross compiler (the flags deploy uses for a CPU board) and for
  this machine (the same flags, native). Goal: the cross build costs no more than the native.

Writes build/bench/arm.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from autodice.backend.engine import cached_ncnn, ncnn_flags
from autodice.backend.gen import gen
from autodice.core.spec import mapping_json
from autodice.deploy.cross import ncnn_for, toolchain
from autodice.deploy.deploy import deploy
from autodice.deploy.emulated import cluster
from autodice.deploy.emulated.state import inventory_toml
from autodice.frontend import zoo
from autodice.frontend.split import split

ROOT = Path(__file__).resolve().parent.parent
HOSTS = ["edge01", "edge02"]
CLUSTER = "bench"  # its own emulated cluster: a user's stays as it is
PLATFORM = "edge01, x86, slots=0-1\nedge02, arm, slots=0-1\n"


def job(work: Path, model: Path, keys: dict[str, list[str]], c) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    (work / "mapping.json").write_text(mapping_json(keys))
    (work / "platform.txt").write_text(PLATFORM)
    (work / "inventory.toml").write_text(inventory_toml(c, HOSTS))
    split(model, work / "mapping.json", work / "platform.txt", work / "out")
    gen(work / "out")
    return work / "out"


def ncnn_builds() -> dict:
    """Both builds into an empty cache, one after the other, wall seconds each."""
    times = {}
    flags = ncnn_flags(vulkan=False, machine="aarch64", features=())
    with tempfile.TemporaryDirectory(prefix="autodice-ncnn-bench-") as tmp:
        os.environ["AUTODICE_CACHE"] = tmp
        try:
            for name, build in (("aarch64 cross", lambda: ncnn_for(toolchain("aarch64"), flags)),
                                ("native", lambda: cached_ncnn(ncnn_flags(vulkan=False)))):
                start = time.monotonic()
                build()
                times[name] = round(time.monotonic() - start, 1)
                print(f"ncnn {name}: {times[name]:.0f} s", flush=True)
        finally:
            del os.environ["AUTODICE_CACHE"]
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--frames", type=int, default=5)
    ap.add_argument("--ncnn", action="store_true", help="also time both ncnn builds")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("arm_bench.py needs root (an emulated cluster)")
    work = ROOT / "build" / "bench" / "arm"
    work.mkdir(parents=True, exist_ok=True)
    model = zoo.cached("squeezenet")
    nodes = [n.name for n in onnx.load(model, load_external_data=False).graph.node]
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    np.save(work / "x.npy", x)
    c = cluster.up(HOSTS, bandwidth="1gbit", arch={"edge02": "aarch64"}, name=CLUSTER,
                    replace=True)
    try:
        whole = {h: job(work / f"whole-{h}", model, {f"{h}_{fam}0": nodes}, c)
                 for h, fam in (("edge01", "x86"), ("edge02", "arm"))}
        per_frame: dict[str, list[float]] = {h: [] for h in whole}
        for k in range(args.rounds):
            for h, out in whole.items():
                res = deploy(out, out.parent / "inventory.toml", run=True,
                             inputs={"data_0": work / "x.npy"}, frames=args.frames)
                rank = res.run.stats["ranks"][0]
                assert rank["arch"] == ("aarch64" if h == "edge02" else "x86_64"), rank
                per_frame[h].append(rank["compute_s"] / rank["frames"])
            print(f"round {k + 1}: x86 {per_frame['edge01'][-1] * 1e3:.0f} ms, aarch64 (qemu) "
                  f"{per_frame['edge02'][-1] * 1e3:.0f} ms a frame", flush=True)
        half = len(nodes) * 2 // 3
        mixed = job(work / "mixed", model, {"edge01_x860": nodes[:half],
                                             "edge02_arm0": nodes[half:]}, c)
        inventory = mixed.parent / "inventory.toml"
        deploy(mixed, inventory)
        again = []
        for _ in range(args.rounds):
            start = time.monotonic()
            res = deploy(mixed, inventory)
            again.append(time.monotonic() - start)
            assert not any(r.compiled or r.files for r in res.hosts.values())
    finally:
        cluster.down(CLUSTER)
    x86, arm = statistics.median(per_frame["edge01"]), statistics.median(per_frame["edge02"])
    result = {
        "model": "squeezenet", "frames": args.frames, "rounds": args.rounds,
        "per_frame_s": {"x86_64": x86, "aarch64_qemu": arm}, "qemu_slowdown": arm / x86,
        "redeploy_s": statistics.median(again), "redeploy_goal_s": 1.0,
        "redeploy_runs_s": again, "ncnn_build_s": ncnn_builds() if args.ncnn else None,
    }
    print(f"SqueezeNet a frame, one rank: x86 {x86 * 1e3:.1f} ms, aarch64 under qemu "
          f"{arm * 1e3:.1f} ms: {arm / x86:.1f}x slower")
    print(f"redeploy x86 + aarch64, nothing changed: median {result['redeploy_s']:.2f} s "
          f"(goal <= 1.0 s)")
    out = ROOT / "build" / "bench" / "arm.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
