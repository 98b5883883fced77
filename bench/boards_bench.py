"""Board sensors benchmark (issue 57, needs root): what reading every board's sensors over ssh
while a deployed session streams costs its frames/s, and what one reading takes.

    .venv/bin/python bench/boards_bench.py [--frames 1500] [--rounds 9] [--keep]

SqueezeNet (seeded weights) cut in two, one rank of one thread on each of two emulated hosts
(this script's own cluster, ``bench``), streamed with ``autodice.open(out, inventory=...)``.
Each round streams ``--frames`` frames twice, in turns (the order alternating): ``read``, the
boards' sensors read about every second as every deployed session does
(autodice/deploy/board_figures.py), and ``not read``, the same session with no reader. The
boards' sysfs is a Jetson's tree (an INA3221's three rails, six thermal zones, four CPUs'
clocks: the files the reading prints), so the script does a board's work. Compared: the
steady frames/s of each, the median of the rounds' read / not-read ratios. Then 50 single
readings of one board in a row, as the last one of a stream is taken: the median time of one
(an ssh command through the master connection, the script, the copy written here). And, as a
second measure of the cost, the share of this machine's cores (which the emulated boards share)
busy over ``--idle-s`` seconds with the boards followed and no stream, against as long with
nothing: every process the reading takes (ssh, sshd, the script, this process) counted.

Goal: read ≥ 0.99x not read. Writes build/bench/boards.json.
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

import autodice
import autodice.deploy.stream as deployed
from autodice.backend.engine import ensure_ncnn
from autodice.core.mapping import mapping_json
from autodice.core.model import load_model
from autodice.deploy.board_figures import BoardCopy, BoardWatch
from autodice.deploy.emulated import cluster
from autodice.deploy.emulated.state import inventory_toml
from autodice.deploy.inventory import load_inventory
from autodice.deploy.ssh import Host, Ssh
from autodice.frontend import zoo
from autodice.frontend.split import split
from autodice.frontend.suggest import balanced_mapping

ROOT = Path(__file__).resolve().parent.parent
HOSTS = ["edge01", "edge02"]
CLUSTER = "bench"  # its own emulated cluster: a user's stays as it is


def jetson_tree(root: Path) -> Path:
    """A Jetson's sensor files in sysfs's layout; returns the sysfs folder."""
    files = {"class/hwmon/hwmon1/name": "ina3221"}
    for k, rail in enumerate(("VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"), start=1):
        files |= {f"class/hwmon/hwmon1/in{k}_label": rail, f"class/hwmon/hwmon1/in{k}_input":
                  "5080", f"class/hwmon/hwmon1/curr{k}_input": "1200"}
    for z, kind in enumerate(("CPU-therm", "GPU-therm", "CV0-therm", "CV1-therm", "SOC0-therm",
                              "tj-therm")):
        files |= {f"class/thermal/thermal_zone{z}/type": kind,
                  f"class/thermal/thermal_zone{z}/temp": str(45000 + 500 * z)}
    for cpu in range(4):
        files[f"devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq"] = "1510400"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text + "\n")
    return root


def busy_share(seconds: float) -> float:
    """Share of this machine's cores busy over ``seconds`` (/proc/stat)."""
    def busy() -> tuple[float, float]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields) - fields[3] - fields[4], sum(fields)  # all but idle and iowait

    b0, t0 = busy()
    time.sleep(seconds)
    b1, t1 = busy()
    return (b1 - b0) / max(t1 - t0, 1)


def stream(out: Path, inventory: Path, xs: list, frames: int, read: bool) -> float:
    """Steady frames/s of ``frames`` frames through a deployed session, its boards' sensors
    read or not."""
    real = deployed.BoardWatch
    if not read:
        deployed.BoardWatch = lambda ssh, hosts: None  # a session with no board reader
    try:
        with autodice.open(out, inventory=inventory) as s:
            list(s.map(itertools.islice(itertools.cycle(xs), frames)))
    finally:
        deployed.BoardWatch = real
    return s.stats()["steady_fps"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--idle-s", type=float, default=20.0)
    ap.add_argument("--keep", action="store_true", help="leave the cluster up")
    ap.add_argument("--json", type=Path, default=ROOT / "build/bench/boards.json")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("boards_bench.py needs root (an emulated cluster)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.environ["AUTODICE_SYSFS"] = str(jetson_tree(work / "jetson" / "sys"))
        model = work / "squeezenet.onnx"
        zoo.save(zoo.materialize("squeezenet", seed=0), model)
        (work / "platform.txt").write_text("".join(f"{h}, x86, slots=0-1\n" for h in HOSTS))
        mapping = balanced_mapping(load_model(model), [f"{h}_cpu{i}" for i, h in
                                                       enumerate(HOSTS)])
        (work / "mapping.json").write_text(mapping_json(mapping))
        out = work / "out"
        plan = split(model, work / "mapping.json", work / "platform.txt", out)
        autodice.gen(out)
        rng = np.random.default_rng(0)
        xs = [rng.standard_normal(plan.model_inputs[0].shape).astype(np.float32)
              for _ in range(60)]
        c = cluster.up(HOSTS, bandwidth="1gbit", name=CLUSTER, replace=True)
        try:
            inventory = work / "inventory.toml"
            inventory.write_text(inventory_toml(c, HOSTS, ncnn_dir=ensure_ncnn()))
            stream(out, inventory, xs, args.frames // 4, True)  # deployed, built, caches warm
            fps: dict[str, list[float]] = {"read": [], "not read": []}
            ratios = []
            for k in range(args.rounds):
                for arm in (("not read", "read") if k % 2 == 0 else ("read", "not read")):
                    fps[arm].append(stream(out, inventory, xs, args.frames, arm == "read"))
                ratios.append(fps["read"][-1] / fps["not read"][-1])
                print(f"round {k + 1}: not read {fps['not read'][-1]:.1f}, read "
                      f"{fps['read'][-1]:.1f} frames/s", file=sys.stderr)
            inv = load_inventory(inventory)
            board = BoardCopy(inv.targets["edge01"], work / "copy")
            ssh = Ssh(inv, work)
            board.read_once(ssh, os.environ["AUTODICE_SYSFS"])  # the master connection opened
            took = []
            for _ in range(50):
                t0 = time.perf_counter()
                assert board.read_once(ssh, os.environ["AUTODICE_SYSFS"]), "a reading failed"
                took.append(time.perf_counter() - t0)
            quiet = busy_share(args.idle_s)
            with BoardWatch(ssh, [Host(t) for t in inv.targets.values()]) as watch:
                watch.start(None)
                following = busy_share(args.idle_s)
                readings = watch.hosts[0].energy.seconds
        finally:
            if not args.keep:
                cluster.down(CLUSTER)
    ratio = statistics.median(ratios)
    reading_ms = 1e3 * statistics.median(took)
    print(f"SqueezeNet on {len(HOSTS)} emulated hosts, {args.frames} frames a stream, "
          f"{args.rounds} paired rounds")
    print(f"not read   {statistics.median(fps['not read']):8.1f} frames/s (median)")
    print(f"read       {statistics.median(fps['read']):8.1f} frames/s (median), each board "
          "read about every second")
    print(f"read / not {ratio:8.3f} (median of the rounds' ratios; goal ≥ 0.99)")
    print(f"one reading {reading_ms:7.1f} ms (median of 50 single ones: an ssh command, the "
          "script, the copy)")
    print(f"cores busy  {100 * quiet:6.2f} % with nothing, {100 * following:.2f} % with "
          f"{len(HOSTS)} boards followed ({readings:.0f} s of readings): "
          f"{100 * (following - quiet):+.2f} points")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "model": "squeezenet", "hosts": HOSTS, "frames": args.frames, "rounds": args.rounds,
        "fps": fps, "ratios": ratios, "reading_ms": [1e3 * t for t in took],
        "cores_busy": {"nothing": quiet, "following": following, "idle_s": args.idle_s},
        "goals": [{"goal": "a deployed SqueezeNet session with its boards' sensors read keeps "
                           "≥ 0.99x frames/s", "value": ratio, "shown": f"{ratio:.3f}x",
                   "ok": ratio >= 0.99}]}, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
