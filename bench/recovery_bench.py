"""Recovery benchmark on the emulated cluster (issue 23, needs root): a board lost mid-stream.

    .venv/bin/python bench/recovery_bench.py [--model squeezenet] [--rounds 5] [--keep]

SqueezeNet cut into three balanced runs, one per host (edge01 holds the input), streamed with
``autodice.open(..., recover=True)``; in each round edge02's rank is killed (``kill -9``) at a
random frame, and the stream goes on over edge01 and edge03. Two ways, rounds interleaved:

- ``ready``: the fallback for edge02's loss was prepared and shipped while the stream ran
  (the session waits for it before the kill): recovery is a re-check and a restart;
- ``cold``: nothing prepared (``ahead=False``; the fallback's folders, here and on the hosts,
  and its cached pnnx conversions removed first): recovery splits, converts (pnnx, checked
  against onnxruntime), deploys and builds.

Per round: from the kill to the first new result, and its parts as the session reports them:
detect (the kill until the dead job is stopped and the lost host named: the gateway's hang-up,
the probe over ssh, the job's evidence), plan (mapping, split, gen), deploy (ship), restart
(mpirun and the ranks' start until the gateway says hello), frames sent again against the
frames in flight. Every result is checked against onnxruntime on its own frame. Goals: <= 3 s
ready, <= 10 s cold (medians), replayed <= in flight. Writes build/bench/recovery.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import autodice
from autodice.backend.convert import _digest
from autodice.backend.engine import cache_root, ensure_ncnn
from autodice.core.mapping import mapping_json
from autodice.core.model import load_model
from autodice.core.plan import load_plan
from autodice.deploy.emulated import cluster
from autodice.deploy.emulated.state import inventory_toml
from autodice.frontend import zoo
from autodice.frontend.check import session as ort_session
from autodice.frontend.split import split
from autodice.frontend.suggest import balanced_mapping

ROOT = Path(__file__).resolve().parent.parent
HOSTS = ["edge01", "edge02", "edge03"]
VICTIM = "edge02"
CLUSTER = "bench"  # its own emulated cluster: a user's stays as it is


def prepare(model: Path, work: Path, c: cluster.Cluster) -> tuple[Path, Path]:
    work.mkdir(parents=True, exist_ok=True)
    (work / "platform.txt").write_text("".join(f"{h}, x86, slots=0-1\n" for h in HOSTS))
    mapping = balanced_mapping(load_model(model), [f"{h}_cpu{i % 2}" for i, h in
                                                   enumerate(HOSTS)])
    (work / "mapping.json").write_text(mapping_json(mapping))
    split(model, work / "mapping.json", work / "platform.txt", work / "out")
    autodice.gen(work / "out")
    inventory = work / "inventory.toml"
    inventory.write_text(inventory_toml(c, HOSTS, ncnn_dir=ensure_ncnn()))
    return work / "out", inventory


def forget_fallbacks(out: Path, c: cluster.Cluster) -> None:
    """A cold round: no fallback here or on the hosts from an earlier round, nor the pnnx
    conversions of its sub-models in the cache."""
    fallback = out / "recovery" / f"without-{VICTIM}"
    if (fallback / "plan.json").exists():
        for r in load_plan(fallback).ranks:
            shutil.rmtree(cache_root() / "pnnx" / _digest(fallback / r.submodel, False),
                          ignore_errors=True)
    shutil.rmtree(out / "recovery", ignore_errors=True)
    for h in c.hosts:
        for d in Path(h.remote_dir).glob("without-*"):
            shutil.rmtree(d, ignore_errors=True)


def one_round(out: Path, inventory: Path, c: cluster.Cluster, ready: bool, xs: np.ndarray,
              at: int) -> dict:
    """Stream ``xs``, kill the victim's rank after frame ``at``; the round's figures."""
    program = str(Path(next(h.remote_dir for h in c.hosts if h.name == VICTIM))
                  / "build" / "program")
    delivered: list[float] = []
    results = []
    killed_at = 0.0
    with autodice.open(out, inventory=inventory, recover=True, ahead=ready) as s:
        if ready:
            assert s.recovery.wait_ready(600), "the fallback could not be prepared"
        for i, y in enumerate(s.map(iter(xs))):
            delivered.append(time.monotonic())
            results.append(y)
            if i == at:
                for pid in cluster.netns_pids(
                        next(h.netns for h in c.hosts if h.name == VICTIM)):
                    try:
                        if os.readlink(f"/proc/{pid}/exe") == program:
                            os.kill(pid, signal.SIGKILL)
                    except OSError:
                        continue
                killed_at = time.monotonic()
        (incident,) = s.stats()["incidents"]
        window = s.window
    first_new = delivered[incident["after_frame"] + 1]
    return {"ready": ready, "kill_to_first_result_s": first_new - killed_at,
            "notice_s": first_new - killed_at - incident["first_result_s"],
            **{k: incident[k] for k in ("detect_s", "plan_s", "deploy_s", "restart_s",
                                         "first_result_s", "replayed", "after_frame")},
            "in_flight_max": window, "prepared_ahead": incident["prepared_ahead"],
            "results": results}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="squeezenet")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--frames", type=int, default=600)
    ap.add_argument("--keep", action="store_true", help="leave the cluster up")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("recovery_bench.py needs root (an emulated cluster)")
    work = ROOT / "build" / "bench" / "recovery"
    shutil.rmtree(work, ignore_errors=True)
    model = zoo.cached(args.model)
    c = cluster.up(HOSTS, bandwidth="1gbit", name=CLUSTER, replace=True)
    try:
        out, inventory = prepare(model, work, c)
        t = autodice.plan(model, out / "mapping.json", out / "platform.txt").model_inputs[0]
        rng = np.random.default_rng(0)
        xs = rng.standard_normal((args.frames, *t.shape)).astype(np.float32)
        ref = ort_session(model)
        want = [ref.run(None, {t.name: x})[0] for x in xs]
        rounds = []
        for k in range(args.rounds):
            for ready in (True, False):
                if not ready:
                    forget_fallbacks(out, c)
                at = int(rng.integers(50, args.frames // 2))
                r = one_round(out, inventory, c, ready, xs, at)
                got = r.pop("results")
                assert len(got) == len(xs), f"{len(got)} results for {len(xs)} frames"
                worst = max(float(np.max(np.abs(g - w)) / (np.max(np.abs(w)) + 1e-12))
                            for g, w in zip(got, want))
                assert worst < 1e-4, f"round {k}: a result differs (rel {worst:.2e})"
                r["worst_rel"] = worst
                rounds.append(r)
                print(f"round {k} {'ready' if ready else 'cold '}: kill -> first new result "
                      f"{r['kill_to_first_result_s']:.2f} s (detect {r['detect_s']:.2f}, plan "
                      f"{r['plan_s']:.2f}, deploy {r['deploy_s']:.2f}, restart "
                      f"{r['restart_s']:.2f}), {r['replayed']} frames sent again, all "
                      f"{len(got)} right (rel {worst:.1e})", flush=True)
    finally:
        if not args.keep:
            cluster.down(CLUSTER)
    summary = {}
    for name, ready, goal in (("ready", True, 3.0), ("cold", False, 10.0)):
        rs = [r for r in rounds if r["ready"] == ready]
        med = {k: statistics.median(r[k] for r in rs)
               for k in ("kill_to_first_result_s", "notice_s", "detect_s", "plan_s",
                         "deploy_s", "restart_s")}
        summary[name] = {**med, "goal_s": goal, "rounds": len(rs),
                         "replayed_max": max(r["replayed"] for r in rs),
                         "in_flight_max": rs[0]["in_flight_max"]}
    print(f"\n{args.model}, {len(HOSTS)} -> {len(HOSTS) - 1} emulated hosts, medians of "
          f"{args.rounds}:")
    print(f"{'':7}{'kill->result':>13}{'detect':>8}{'plan':>7}{'deploy':>8}{'restart':>9}"
          f"{'goal':>7}")
    for name, m in summary.items():
        print(f"{name:7}{m['kill_to_first_result_s']:>12.2f}s{m['detect_s']:>7.2f}s"
              f"{m['plan_s']:>6.2f}s{m['deploy_s']:>7.2f}s{m['restart_s']:>8.2f}s"
              f"{m['goal_s']:>6.0f}s")
    dest = ROOT / "build" / "bench" / "recovery.json"
    dest.write_text(json.dumps({"model": args.model, "hosts": HOSTS, "victim": VICTIM,
                                "summary": summary, "rounds": rounds}, indent=1) + "\n")
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
