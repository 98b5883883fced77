"""Deploy benchmark on the emulated edge cluster (needs root): deploy time, link throughput and
end-to-end pipelined frames/s.

1. Deploy time to 8 hosts (a zoo model cut into 8 sub-models, one per host): the first deploy
   onto bare hosts (fresh homes: the runtime library is compiled too, once per host kind), the
   first deploy of a plan into empty remote directories on hosts that keep the runtime library
   (copy + a build of program.cpp alone), then redeploys: nothing changed, one
   sub-model's weights changed (retrained: only its .bin moves, no rebuild), and one layer moved
   between two hosts (two sub-models and the program change: a rebuild). Then the redeploy with
   nothing changed to 32 hosts (SqueezeNet cut 32 ways), where per-host costs add up on this
   machine's cores. Each is compared with its goal (issue 15, P7). Paper: 21-27 s to 8 boards.
2. Tensor throughput between two hosts over their 1 Gbit/s tbf-shaped links: the runtime's own
   ``bench_transfer`` (autodice::Transfer, ping-pong of 1-64 MiB tensors) under mpirun's ssh
   launcher, against the shaped rate. Goal >= 90 %.
3. End-to-end pipelined frames/s of a zoo model deployed to 2 and 4 hosts, beside the same plan
   run with all ranks on this machine (``autodice run``, no network).

Prints a table, writes JSON (build/bench/deploy.json). Run as root:
``.venv/bin/python bench/deploy_bench.py`` (``--keep`` leaves the cluster up, ``--parts`` picks
parts, e.g. ``--parts deploy``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from autodice.backend.build import build
from autodice.backend.engine import cmake_args, ensure_ncnn, mpi_prefix
from autodice.backend.gen import gen
from autodice.backend.run import run
from autodice.core.mapping import mapping_json
from autodice.core.model import load_model
from autodice.core.plan import load_plan
from autodice.deploy.deploy import deploy
from autodice.deploy.emulated import cluster
from autodice.deploy.emulated.state import inventory_toml
from autodice.deploy.inventory import load_inventory
from autodice.deploy.ssh import close_connections, ssh_config
from autodice.frontend import zoo
from autodice.frontend.split import split
from autodice.frontend.suggest import balanced_mapping

ROOT = Path(__file__).resolve().parent.parent
HOSTS = [f"edge{i:02d}" for i in range(1, 9)]
CLUSTER = "bench"  # its own emulated cluster: a user's stays as it is
RATE = 125e6  # bytes/s of 1 Gbit/s


def model_path(name: str) -> Path:
    return zoo.cached(name)


def prepare(model: Path, hosts: list[str], work: Path, c: cluster.Cluster) -> tuple[dict, Path]:
    """Split ``model`` over ``hosts`` (one key per host, alternating cores 0 and 1), gen."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "platform.txt").write_text("".join(f"{h}, x86, slots=0-1\n" for h in hosts))
    keys = [f"{h}_cpu{i % 2}" for i, h in enumerate(hosts)]
    mapping = balanced_mapping(load_model(model), keys)
    split_gen(model, mapping, work)
    inventory = work / "inventory.toml"
    inventory.write_text(inventory_toml(c, hosts, ncnn_dir=ensure_ncnn()))
    return mapping, inventory


def split_gen(model: Path, mapping: dict, work: Path) -> None:
    (work / "mapping.json").write_text(mapping_json(mapping))
    split(model, work / "mapping.json", work / "platform.txt", work / "out")
    gen(work / "out")


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def perturb(path: Path, k: int) -> None:
    """New weights for one sub-model, as after retraining: every float scaled."""
    data = np.fromfile(path, dtype=np.uint8)
    body = data[: len(data) // 4 * 4].view(np.float32) * np.float32(1.0 + 1e-3 * (k + 1))
    data[: len(data) // 4 * 4] = body.view(np.uint8)
    data.tofile(path)


def bench_deploy_time(model: Path, work: Path, c: cluster.Cluster, repeat: int) -> list[dict]:
    mapping, inventory = prepare(model, HOSTS, work, c)
    empty_remote_dirs(c)
    out = work / "out"
    rows = []

    t, res = timed(lambda: deploy(out, inventory))
    rows.append(row("bare", [t], [res], len(HOSTS)))
    runs = []
    for _ in range(repeat):  # as a new session would: no ssh connection open yet
        empty_remote_dirs(c)
        close_connections(load_inventory(inventory).targets.values(), now=True)
        runs.append(timed(lambda: deploy(out, inventory)))
    rows.append(row("first", *zip(*runs), len(HOSTS)))
    runs = [timed(lambda: deploy(out, inventory)) for _ in range(repeat)]
    rows.append(row("nothing", *zip(*runs), len(HOSTS)))
    runs = []
    victim = HOSTS[len(HOSTS) // 2]
    bin_file = next((out / "packages" / victim / "models").glob("*.bin"))
    for k in range(repeat):
        perturb(bin_file, k)
        runs.append(timed(lambda: deploy(out, inventory)))
        moved = [f for h in runs[-1][1].hosts.values() for f in h.files]
        assert moved == [f"models/{bin_file.name}"], moved
    rows.append(row("weights", *zip(*runs), len(HOSTS)))
    runs = []
    keys = list(mapping)
    a, b = keys[len(keys) // 2 - 1], keys[len(keys) // 2]
    for k in range(repeat):  # move b's first layer to a, then back
        if k % 2 == 0:
            mapping[a].append(mapping[b].pop(0))
        else:
            mapping[b].insert(0, mapping[a].pop())
        split_gen(model, mapping, work)
        runs.append(timed(lambda: deploy(out, inventory)))
    rows.append(row("layer", *zip(*runs), len(HOSTS)))
    return rows


def bench_deploy_scale(model: Path, work: Path, n: int, repeat: int) -> list[dict]:
    """Redeploy with nothing changed to ``n`` hosts (after a first deploy to get there)."""
    hosts = [f"edge{i:02d}" for i in range(1, n + 1)]
    c = cluster.up(hosts, bandwidth="1gbit", name=CLUSTER, replace=True)
    _, inventory = prepare(model, hosts, work, c)
    empty_remote_dirs(c)
    out = work / "out"
    t, res = timed(lambda: deploy(out, inventory))
    bare = row("bare", [t], [res], n)
    runs = [timed(lambda: deploy(out, inventory)) for _ in range(repeat)]
    return [bare, row("nothing", *zip(*runs), n)]


def empty_remote_dirs(c: cluster.Cluster) -> None:
    """A first deploy starts from empty remote directories."""
    for h in c.hosts:
        shutil.rmtree(h.remote_dir, ignore_errors=True)
        Path(h.remote_dir).mkdir(parents=True)


CASES = {"bare": "first deploy onto bare hosts (+ runtime library)",
         "first": "first deploy of a plan (copy + build)",
         "nothing": "redeploy, nothing changed",
         "weights": "redeploy, one sub-model's weights changed",
         "layer": "redeploy, one layer moved (2 sub-models + program)"}
# Goals of issue 15 (P7), seconds: (case, hosts) -> limit.
GOALS = {("first", 8): 5.0, ("nothing", 8): 1.0, ("weights", 8): 1.2, ("layer", 8): 2.5,
         ("nothing", 32): 2.0}


def row(case: str, seconds, results, hosts: int) -> dict:
    """One table row: the median of ``seconds`` and, per step, the median over the runs."""
    last = results[-1]
    steps = {k: statistics.median(r.seconds.get(k, 0.0) for r in results)
             for k in last.seconds}
    goal = GOALS.get((case, hosts))
    median = statistics.median(seconds)
    return {"case": case, "what": CASES[case], "hosts": hosts, "median_s": median,
            "runs_s": list(seconds), "goal_s": goal,
            "met": None if goal is None else median <= goal,
            "bytes_sent": sum(h.bytes_sent for h in last.hosts.values()),
            "steps_s": steps, "compiled": any(h.compiled for h in last.hosts.values())}


def bench_link(work: Path, c: cluster.Cluster) -> list[dict]:
    """bench_transfer between edge01 and edge02: one-way tensor throughput over the links."""
    build = ROOT / "build" / "bench" / "transfer-build"
    ncnn = ensure_ncnn()
    subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                    "-DAUTODICE_BUILD_TESTS=OFF", *cmake_args(ncnn)], check=True,
                   capture_output=True)
    subprocess.run(["cmake", "--build", str(build), "--target", "bench_transfer", "-j", "2"],
                   check=True, capture_output=True)
    program = next(build.rglob("bench_transfer"))
    inv = load_inventory(c.state_dir + "/inventory.toml")
    cfg = work / "ssh_config"
    cfg.write_text(ssh_config(inv.targets.values(), by="address"))
    a, b = c.hosts[0], c.hosts[1]
    prefix = mpi_prefix()
    out_json = work / "transfer.json"
    cmd = ["ip", "netns", "exec", a.netns, "env", "OMPI_ALLOW_RUN_AS_ROOT=1",
           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", f"{prefix}/bin/mpirun", "--prefix", str(prefix),
           "--prtemca", "plm_ssh_agent", f"ssh -F {cfg}", "--prtemca", "plm_ssh_no_tree_spawn",
           "1", "--prtemca", "prte_if_include", c.subnet, "--mca", "btl_tcp_if_include",
           c.subnet, "--host", f"{a.address},{b.address}", "-np", "2", str(program),
           str(out_json), "5"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    rows = []
    for r in json.loads(out_json.read_text())["rows"]:
        if r["bytes"] >= 1 << 20:
            rate = r["bytes"] / (r["transfer_us"] / 1e6)
            rows.append({"shape": r["shape"], "bytes": r["bytes"],
                         "one_way_s": r["transfer_us"] / 1e6,
                         "bytes_per_s": rate, "of_shaped_rate": rate / RATE})
    return rows


def busiest_link_bytes(plan) -> int:
    """Bytes per frame on the busiest host link (one direction): cut tensors between hosts."""
    host = {r.rank: r.host for r in plan.ranks}
    out: dict[str, int] = {}
    into: dict[str, int] = {}
    for e in plan.edges:
        for d in e.dst:
            if host[d] != host[e.src]:
                out[host[e.src]] = out.get(host[e.src], 0) + e.nbytes
                into[host[d]] = into.get(host[d], 0) + e.nbytes
    return max([*out.values(), *into.values(), 0])


def bench_e2e(model: Path, work: Path, c: cluster.Cluster, frames: int) -> list[dict]:
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    np.save(work / "x.npy", x)
    rows = []
    for n in (2, 4):
        sub = work / f"e2e{n}"
        _, inventory = prepare(model, HOSTS[:n], sub, c)
        name = load_plan(sub / "out").model_inputs[0].name
        res = deploy(sub / "out", inventory, run=True, inputs={name: work / "x.npy"},
                     frames=frames)
        build(sub / "out")
        local = run(sub / "out", {name: work / "x.npy"}, frames=frames, results=sub / "local")
        rows.append({"hosts": n, "frames": frames, "deployed_fps": res.run.stats["fps"],
                     "local_fps": local.stats["fps"],
                     "link_bound_fps": RATE / max(busiest_link_bytes(load_plan(sub / "out")), 1)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="Redeploys per case (median).")
    ap.add_argument("--model", default="resnet50", help="Zoo model for the deploy times.")
    ap.add_argument("--scale-model", default="squeezenet",
                    help="Zoo model for the redeploy to many hosts.")
    ap.add_argument("--scale-hosts", type=int, default=32, help="Hosts of the scale row.")
    ap.add_argument("--e2e-model", default="squeezenet", help="Zoo model for frames/s.")
    ap.add_argument("--frames", type=int, default=60, help="Frames per end-to-end run.")
    ap.add_argument("--parts", default="deploy,link,e2e,scale",
                    help="Comma-separated parts to run: deploy, link, e2e, scale.")
    ap.add_argument("--json", type=Path, default=ROOT / "build" / "bench" / "deploy.json")
    ap.add_argument("--keep", action="store_true", help="Leave the cluster up afterwards.")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if os.geteuid() != 0:
        sys.exit("deploy_bench needs root (it brings up the emulated cluster)")
    work = ROOT / "build" / "bench" / "deploy"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    deploy_rows, link_rows, e2e_rows = [], [], []
    try:
        if parts & {"deploy", "link", "e2e"}:
            c = cluster.up(HOSTS, bandwidth="1gbit", name=CLUSTER, replace=True)
            if "deploy" in parts:
                deploy_rows += bench_deploy_time(model_path(args.model), work / "time", c,
                                                 args.repeat)
            if "link" in parts:
                link_rows = bench_link(work, c)
            if "e2e" in parts:
                e2e_rows = bench_e2e(model_path(args.e2e_model), work, c, args.frames)
        if "scale" in parts:
            deploy_rows += bench_deploy_scale(model_path(args.scale_model), work / "scale",
                                              args.scale_hosts, args.repeat)
    finally:
        if not args.keep:
            cluster.down(CLUSTER)
    if deploy_rows:
        print(f"\n1. deploy {args.model} to {len(HOSTS)} emulated hosts, {args.scale_model} to "
              f"{args.scale_hosts} (median of {args.repeat}):")
        print(f"   {'case':<52} {'hosts':>5} {'seconds':>8} {'goal':>7} {'sent':>10} "
              f"{'compiled':>8}  steps (s)")
        for r in deploy_rows:
            steps = ", ".join(f"{k} {v:.2f}" for k, v in r["steps_s"].items())
            goal = "" if r["goal_s"] is None else f"{'✔' if r['met'] else '✘'} {r['goal_s']:g}"
            print(f"   {r['what']:<52} {r['hosts']:>5} {r['median_s']:>8.2f} {goal:>7} "
                  f"{r['bytes_sent'] / 1e6:>8.2f}MB {'yes' if r['compiled'] else 'no':>8}  "
                  f"{steps}")
    if link_rows:
        print("\n2. tensor throughput edge01 -> edge02 over 1 Gbit/s tbf links "
              "(autodice::Transfer):")
        print(f"   {'shape':<18} {'MiB':>6} {'one-way s':>10} {'MB/s':>8} {'of 125 MB/s':>12}")
        for r in link_rows:
            print(f"   {r['shape']:<18} {r['bytes'] / 2**20:>6.0f} {r['one_way_s']:>10.4f} "
                  f"{r['bytes_per_s'] / 1e6:>8.1f} {r['of_shaped_rate']:>11.1%}")
    if e2e_rows:
        print(f"\n3. {args.e2e_model}, {args.frames} frames pipelined:")
        print(f"   {'hosts':>5} {'deployed fps':>13} {'local fps':>10} {'link-bound fps':>15}")
        for r in e2e_rows:
            print(f"   {r['hosts']:>5} {r['deployed_fps']:>13.2f} {r['local_fps']:>10.2f} "
                  f"{r['link_bound_fps']:>15.2f}")
        print("   (local: the same ranks on this machine, no network; link-bound: 1 Gbit/s over "
              "the busiest host link's cut tensors per frame)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "benchmark": "deploy", "machine_cpus": os.cpu_count(),
        "load_average": os.getloadavg(), "deploy_model": args.model,
        "scale_model": args.scale_model, "e2e_model": args.e2e_model, "deploy": deploy_rows,
        "link": link_rows, "e2e": e2e_rows}, indent=2, ensure_ascii=False) + "\n")
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
