"""ARM benchmark on the emulated cluster (issue 21, needs root): an x86 host and two aarch64 boards,
one on Debian 12 (bookworm) and one on Debian 11 (bullseye, glibc 2.31: an older OS).

    .venv/bin/python bench/arm_bench.py [--rounds 5] [--frames 5] [--ncnn]

- **qemu's cost**: the whole SqueezeNet as one rank, once on edge01 (x86, this machine's CPU)
  and once on edge02 (aarch64 under qemu-user), rounds interleaved; per frame the rank's own
  compute time from stats.json (load and transfer apart). The ratio is what docs/boards.md
  calls the emulation's slowdown. It compares ncnn's x86 kernels with its aarch64 NEON kernels
  translated by qemu: a real board's figure is its own.
- **redeploy, nothing changed**: SqueezeNet in two halves over edge01 and a board (its
  program cross-built here), deployed once, then again with nothing changed: median seconds of
  the whole ``deploy()``, for the bookworm board and for the bullseye one. Goal: <= 1.0 s for
  2 hosts, as on x86 hosts.
- ``--ncnn``: ncnn built from the pinned source package into an empty cache twice, side by
  side: for aarch64 with the cross compiler (the flags deploy uses for a CPU board) and for
  this machine (the same flags, native). Goal: the cross build costs no more than the native.
  Then the first deploy of the whole model to each board, each into an empty cache (the source
  package and the Open MPI wheel copied in, so no download is timed): what the bullseye board
  costs more is its release's files and its own ncnn build. Goal: at most 30 s more.

Writes build/bench/arm.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from autodice.backend.engine import cache_root, cached_ncnn, ncnn_flags
from autodice.backend.gen import gen
from autodice.core.mapping import mapping_json
from autodice.deploy.cross import ncnn_for, toolchain
from autodice.deploy.deploy import deploy
from autodice.deploy.emulated import cluster
from autodice.deploy.emulated.state import inventory_toml
from autodice.frontend import zoo
from autodice.frontend.split import split

ROOT = Path(__file__).resolve().parent.parent
HOSTS = ["edge01", "edge02", "edge03"]
BOARDS = {"edge02": "aarch64", "edge03": "aarch64:bullseye"}
CLUSTER = "bench"  # its own emulated cluster: a user's stays as it is
PLATFORM = "edge01, x86, slots=0-1\nedge02, arm, slots=0-1\nedge03, arm, slots=0-1\n"


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


def first_deploys(whole: dict[str, Path]) -> dict:
    """The first deploy of the whole model to each board, each into an empty cache holding only
    the ncnn source package and the Open MPI wheel; wall seconds each."""
    times = {}
    kept = cache_root()
    for host in BOARDS:
        out = whole[host]
        with tempfile.TemporaryDirectory(prefix="autodice-deploy-bench-") as tmp:
            for part in ("ncnn/downloads", "openmpi"):
                shutil.copytree(kept / part, Path(tmp) / part, symlinks=True)
            shutil.rmtree(out / "deploy", ignore_errors=True)
            os.environ["AUTODICE_CACHE"] = tmp
            try:
                start = time.monotonic()
                res = deploy(out, out.parent / "inventory.toml")
                times[BOARDS[host]] = round(time.monotonic() - start, 1)
            finally:
                del os.environ["AUTODICE_CACHE"]
            assert res.hosts[host].compiled, res.hosts[host]
        print(f"first deploy to the {BOARDS[host]} board, empty cache: {times[BOARDS[host]]:.0f} s",
              flush=True)
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
    c = cluster.up(HOSTS, bandwidth="1gbit", arch=BOARDS, name=CLUSTER, replace=True)
    try:
        whole = {h: job(work / f"whole-{h}", model, {f"{h}_{fam}0": nodes}, c)
                 for h, fam in (("edge01", "x86"), ("edge02", "arm"), ("edge03", "arm"))}
        per_frame: dict[str, list[float]] = {h: [] for h in ("edge01", "edge02")}
        for k in range(args.rounds):
            for h in per_frame:
                out = whole[h]
                res = deploy(out, out.parent / "inventory.toml", run=True,
                             inputs={"data_0": work / "x.npy"}, frames=args.frames)
                rank = res.run.stats["ranks"][0]
                assert rank["arch"] == ("aarch64" if h == "edge02" else "x86_64"), rank
                per_frame[h].append(rank["compute_s"] / rank["frames"])
            print(f"round {k + 1}: x86 {per_frame['edge01'][-1] * 1e3:.0f} ms, aarch64 (qemu) "
                  f"{per_frame['edge02'][-1] * 1e3:.0f} ms a frame", flush=True)
        half = len(nodes) * 2 // 3
        again: dict[str, list[float]] = {}
        for board, kind in BOARDS.items():
            mixed = job(work / f"mixed-{board}", model, {"edge01_x860": nodes[:half],
                                                         f"{board}_arm0": nodes[half:]}, c)
            inventory = mixed.parent / "inventory.toml"
            deploy(mixed, inventory)
            again[kind] = []
            for _ in range(args.rounds):
                start = time.monotonic()
                res = deploy(mixed, inventory)
                again[kind].append(time.monotonic() - start)
                assert not any(r.compiled or r.files for r in res.hosts.values())
        first = first_deploys(whole) if args.ncnn else None
    finally:
        cluster.down(CLUSTER)
    x86, arm = statistics.median(per_frame["edge01"]), statistics.median(per_frame["edge02"])
    result = {
        "model": "squeezenet", "frames": args.frames, "rounds": args.rounds,
        "per_frame_s": {"x86_64": x86, "aarch64_qemu": arm}, "qemu_slowdown": arm / x86,
        "redeploy_s": {k: statistics.median(v) for k, v in again.items()},
        "redeploy_goal_s": 1.0, "redeploy_runs_s": again,
        "first_deploy_empty_cache_s": first, "first_deploy_extra_goal_s": 30.0,
        "ncnn_build_s": ncnn_builds() if args.ncnn else None,
    }
    print(f"SqueezeNet a frame, one rank: x86 {x86 * 1e3:.1f} ms, aarch64 under qemu "
          f"{arm * 1e3:.1f} ms: {arm / x86:.1f}x slower")
    for kind, median in result["redeploy_s"].items():
        print(f"redeploy x86 + {kind} board, nothing changed: median {median:.2f} s "
              f"(goal <= 1.0 s)")
    if first:
        extra = first["aarch64:bullseye"] - first["aarch64"]
        print(f"first deploy, empty cache: bullseye board {extra:+.0f} s against bookworm "
              f"(goal <= +30 s)")
    out = ROOT / "build" / "bench" / "arm.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
