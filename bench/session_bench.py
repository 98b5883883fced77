"""Session benchmark (issue 22): feeding real frames from Python against the program's own repeat.

    python bench/session_bench.py [--models squeezenet,resnet50] [--frames 60] [--seconds 2]
                                  [--rounds 5] [--long 10000]

Per model, 2 ranks x 1 thread on this machine's two cores, cut as ``autodice layers --balance``
cuts. Each stream lasts about ``--seconds`` (at least ``--frames`` frames: 60 SqueezeNet frames
are a quarter of a second, mostly the pipeline filling). Each round runs, side by side:

- ``repeat``: ``run --frames N`` on one frame (the program's own loop, no gateway: the ceiling);
- ``session``: N frames through ``autodice.open`` (the gateway, the socket, Python), 60 distinct
  ones in turn;
- ``beside a plain feed``: the repeat again, while ``runtime_cpp/bench/plain_feed.c`` moves the
  same bytes at the session's rate through a Unix socket, its reading end on the gateway's core
  (a feed with nothing of autodice or Python in it: what moving frames at all costs the ranks on
  this machine's cores, the ceiling for any feed);
- ``beside a Python feed``: the repeat again, while ``bench/python_feed.py`` (one Python loop,
  nothing of autodice) writes the same bytes into shared slots at the session's rate, each
  announced through a Unix socket and copied out on the gateway's core: what Python feeding at
  all costs the ranks;
- ``lockstep``: ``run --frames N --no-pipeline`` (one frame through every rank at a time: the
  sum of the ranks' compute and transfer times per frame, measured by the program itself);
- ``one at a time``: the session with ``window=1`` (its end-to-end latency at low load).

Throughput is compared at steady state, both sides the same way: the rate after the first result
(the program's ``steady_fps``, the session's), the median of the rounds' ratios. While the
session streams, the CPU time of the feed (this Python process by its own clock, the gateway rank
from /proc) and of the ranks' processes (/proc) is read, beside what the ranks computed by their
own clocks: on a machine whose every core runs a rank, the feed's time is taken from the ranks'.

Goals: session >= 0.9x repeat; latency at low load <= 1.1x the lockstep frame time. Then
``--long`` distinct frames through Figure 2's three kinds of parallelism (4 ranks: a layer split
by rows, a stage with a replica): every result equal to onnxruntime on its own frame, in order,
none lost or duplicated. Last, what the first stage's copy of a frame costs by Open MPI's single
copy against a memcpy of the session's memfd mapped (``cma_vs_memcpy.c``). Writes
build/bench/session.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from backend_bench import prepare  # noqa: E402
from graphs import figure2  # noqa: E402

import autodice  # noqa: E402
from autodice.backend.run import run  # noqa: E402
from autodice.core.model import load_model  # noqa: E402
from autodice.core.plan import Plan  # noqa: E402
from autodice.dse.balance import balance  # noqa: E402
from autodice.frontend import zoo  # noqa: E402
from autodice.frontend.check import session as ort_session  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def job_pids(out: Path, ranks: int) -> dict[int, int]:
    """MPI rank -> pid of the processes running ``out``'s program: its ``ranks`` ranks and the
    gateway, rank ``ranks``."""
    exe = str((out / "build" / "local" / "program").resolve())
    found = {}
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and os.readlink(p / "exe") == exe:
                env = (p / "environ").read_bytes().split(b"\0")
                rank = next(v for v in env if v.startswith(b"OMPI_COMM_WORLD_RANK="))
                found[int(rank.split(b"=")[1])] = int(p.name)
        except (OSError, StopIteration):
            continue
    if sorted(found) != list(range(ranks + 1)):
        raise RuntimeError(f"{exe}: found ranks {sorted(found)}, not 0-{ranks} (a job left over?)")
    return found


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def switches(pid: int) -> int:
    """Times a process gave up its core so far (/proc/PID/status): for the gateway, each is a
    sleep that ended in a wake-up on rank 0's core."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no voluntary_ctxt_switches")


def compute_ms(ranks: list[dict], frames: int) -> list[float]:
    """Each rank's compute a frame by its own clock (stats.json): the slower stage sets the
    pace, and which one it is tells where the feed's CPU went."""
    return [1e3 * r["compute_s"] / frames for r in ranks]


def stream(out: Path, ranks: int, xs: list, frames: int) -> dict:
    """``frames`` frames (``xs`` in turn) through a session: its steady rate, how long rank 0
    waited for its frames (ms a frame), the gateway's wake-ups a frame, and ms a frame while it
    streamed: the CPU of the feed (this process by its own clock, the gateway from /proc) and of
    the ranks' processes (/proc: computing, receiving, waiting, spinning included), and the
    ranks' compute alone (their own clocks)."""
    with autodice.open(out) as s:
        pids = job_pids(out, ranks)
        before = {r: cpu_s(p) for r, p in pids.items()}
        woke = switches(pids[ranks])
        own = time.process_time()
        list(s.map(itertools.islice(itertools.cycle(xs), frames)))
        own = time.process_time() - own
        used = {r: cpu_s(p) - before[r] for r, p in pids.items()}
        woke = switches(pids[ranks]) - woke
    st = s.stats()
    return {"steady_fps": st["steady_fps"], "frames_via": st["frames_via"],
            "gateway_wakeups": woke / frames,
            "input_wait_ms": 1e3 * (st["ranks"][0]["recv_wait_s"] +
                                    st["ranks"][0]["frame_wait_s"]) / frames,
            "ms_a_frame": {"python": 1e3 * own / frames,
                           "gateway": 1e3 * used.pop(ranks) / frames,
                           "ranks": 1e3 * sum(used.values()) / frames},
            "ranks_computing_ms": compute_ms(st["ranks"], frames)}


def compiled(dest: Path, name: str) -> Path:
    """Compile ``runtime_cpp/bench/<name>.c`` into ``dest``."""
    exe = dest / name
    subprocess.run(["cc", "-O2", "-o", str(exe), str(ROOT / "runtime_cpp" / "bench" /
                                                      f"{name}.c")], check=True)
    return exe


def frame_copy(work: Path, frame_bytes: int) -> dict:
    """What taking a frame out of shared memory another process just wrote costs the first
    stage: Open MPI's single copy (process_vm_readv) against a memcpy of the memfd mapped
    (``cma_vs_memcpy.c``, medians of 300 in turns)."""
    exe = compiled(work, "cma_vs_memcpy")
    got = subprocess.run([str(exe), str(frame_bytes)], check=True, capture_output=True, text=True)
    return {k: v for k, v in json.loads(got.stdout).items() if k != "check"}


def beside_feed(feed: Path, out: Path, plan: Plan, feeds: dict, frames: int, rate: float,
                python: bool = False) -> float:
    """The repeat's steady rate while ``feed`` moves a frame's bytes, and a result's back, at
    ``rate`` frames/s, its reading end on rank 0's first core, where a session's gateway sits;
    ``python``: the writing end is python_feed.py's Python loop."""
    argv = [str(feed), str(sum(t.nbytes for t in plan.model_inputs)),
            str(sum(t.nbytes for t in plan.model_outputs)), f"{rate:.1f}",
            f"{5 + frames / rate:.1f}", str(plan.ranks[0].slots[0])]  # past the job's start
    if python:
        argv = [sys.executable, str(ROOT / "bench" / "python_feed.py"), *argv]
    with subprocess.Popen(argv, stdout=subprocess.DEVNULL) as p:
        try:
            return run(out, feeds, frames).stats["steady_fps"]
        finally:
            p.terminate()  # its reading end exits when the socket closes


def measure_model(name: str, work: Path, feed: Path, frames: int, seconds: float,
                  rounds: int) -> dict:
    model = work / f"{name}.onnx"
    zoo.save(zoo.materialize(name, seed=0), model)
    graph = load_model(model)
    mapping = balance(graph, model, ["edge01_x860", "edge01_x861"]).mapping
    out = prepare(model, mapping, work / name)
    plan = autodice.plan(model, mapping, work / name / "platform.txt")
    t, ranks = plan.model_inputs[0], len(plan.ranks)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(t.shape).astype(np.float32) for _ in range(60)]
    feeds = {t.name: work / f"{name}-x.npy"}
    np.save(feeds[t.name], xs[0])
    # A stream of about `seconds` at the program's own rate (this run also warms the caches).
    warm = run(out, feeds, frames).stats
    frames = max(frames, round(seconds * (warm["steady_fps"] or warm["fps"])))
    fps = {"repeat": [], "session": [], "beside a plain feed": [], "beside a Python feed": [],
           "lockstep": []}
    latency, ms, repeat_compute, session_compute, input_wait, wakeups = [], [], [], [], [], []
    for _ in range(rounds):
        res = run(out, feeds, frames)
        fps["repeat"].append(res.stats["steady_fps"])
        repeat_compute.append(compute_ms(res.stats["ranks"], frames))
        got = stream(out, ranks, xs, frames)
        fps["session"].append(got["steady_fps"])
        ms.append(got["ms_a_frame"])
        session_compute.append(got["ranks_computing_ms"])
        input_wait.append(got["input_wait_ms"])
        wakeups.append(got["gateway_wakeups"])
        via = got["frames_via"]
        fps["beside a plain feed"].append(beside_feed(feed, out, plan, feeds, frames,
                                                      got["steady_fps"]))
        fps["beside a Python feed"].append(beside_feed(feed, out, plan, feeds, frames,
                                                       got["steady_fps"], python=True))
        fps["lockstep"].append(run(out, feeds, frames, pipeline=False).stats["fps"])
        with autodice.open(out, window=1) as s:
            for x in xs[: max(10, frames // 3)]:  # at most the 60 distinct frames
                s.infer(x)
        latency.append(s.stats()["latency_s"]["p50"])
    med = {k: statistics.median(v) for k, v in fps.items()}
    lockstep_s = 1 / med["lockstep"]
    return {"model": name, "frames": frames, "rounds": rounds, "fps": fps,
            "frame_bytes": sum(t.nbytes for t in plan.model_inputs),
            "latency_p50_s": latency, "median_fps": med,
            "median_latency_s": statistics.median(latency),
            "ms_a_frame": ms, "repeat_compute_ms": repeat_compute,
            "session_compute_ms": session_compute, "cores": os.cpu_count(),
            "input_wait_ms": input_wait, "median_input_wait_ms": statistics.median(input_wait),
            "frames_via": via, "gateway_wakeups": wakeups,
            "median_gateway_wakeups": statistics.median(wakeups),
            "median_ms_a_frame": {k: statistics.median(c[k] for c in ms) for k in ms[0]},
            "median_compute_ms": {"repeat": per_rank_median(repeat_compute),
                                  "session": per_rank_median(session_compute)},
            "ratios": {"session / repeat": statistics.median(
                           a / b for a, b in zip(fps["session"], fps["repeat"])),
                       "beside a plain feed / repeat": statistics.median(
                           a / b for a, b in zip(fps["beside a plain feed"], fps["repeat"])),
                       "beside a Python feed / repeat": statistics.median(
                           a / b for a, b in zip(fps["beside a Python feed"], fps["repeat"])),
                       "latency / lockstep frame": statistics.median(latency) / lockstep_s}}


def per_rank_median(rounds: list[list[float]]) -> list[float]:
    """Each rank's median over rounds."""
    return [statistics.median(r[k] for r in rounds) for k in range(len(rounds[0]))]


def long_stream(work: Path, n: int) -> dict:
    """n distinct frames through Figure 2's three kinds of parallelism, each checked."""
    d = work / "figure2"
    d.mkdir()
    shutil.copy(ROOT / "specs" / "figure2" / "platform.txt", d / "platform.txt")
    shutil.copy(ROOT / "specs" / "figure2" / "three-kinds.json", d / "mapping.json")
    onnx.save(figure2(), d / "model.onnx")
    autodice.split(d / "model.onnx", d / "mapping.json", d / "platform.txt", d / "out")
    autodice.gen(d / "out")
    autodice.build(d / "out")
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((n, 1, 4, 8, 8)).astype(np.float32)
    whole = ort_session(d / "model.onnx")
    want = [whole.run(None, {"input": x})[0] for x in xs]
    start = time.perf_counter()
    worst, count = 0.0, 0
    with autodice.open(d / "out") as s:
        for i, got in enumerate(s.map(iter(xs))):
            worst = max(worst, float(np.abs(got - want[i]).max() / np.abs(want[i]).max()))
            count += 1
    st = s.stats()
    return {"frames": n, "delivered": count, "worst_rel": worst, "fps": st["fps"],
            "seconds": time.perf_counter() - start, "latency_s": st["latency_s"],
            "ok": count == n and worst <= 1e-5}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="squeezenet,resnet50")
    ap.add_argument("--frames", type=int, default=60, help="the fewest frames a stream has")
    ap.add_argument("--seconds", type=float, default=2.0, help="how long a stream lasts")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--long", type=int, default=10_000)
    ap.add_argument("--json", type=Path, default=ROOT / "build" / "bench" / "session.json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="session-bench-"))
    try:
        feed = compiled(work, "plain_feed")
        models = [measure_model(m, work, feed, args.frames, args.seconds, args.rounds)
                  for m in args.models.split(",")]
        copy = frame_copy(work, models[0]["frame_bytes"])
        print("steady frames/s (plain, py: the repeat beside a plain feed, a bare Python feed / "
              "the repeat); ms a frame "
              "while the session streamed: CPU of the feed (Python, the gateway), each rank "
              "computing (r0/r1, in the repeat and in the session); the gateway's wake-ups a "
              "frame; rank 0's wait for its frames")
        print(f"{'model':<12}{'frames':>7}{'repeat':>9}{'session':>9}{'ratio':>7}{'plain':>7}"
              f"{'py':>6}{'python':>8}{'gateway':>9}{'compute':>13}{'compute':>13}{'wakes':>7}"
              f"{'r0 wait':>9}"
              f"{'lockstep ms':>13}{'latency ms':>12}{'ratio':>7}")
        for m in models:
            med, r, ms = m["median_fps"], m["ratios"], m["median_ms_a_frame"]
            ranks = {k: "/".join(f"{c:.2f}" for c in v) for k, v in m["median_compute_ms"].items()}
            print(f"{m['model']:<12}{m['frames']:>7}{med['repeat']:>9.1f}{med['session']:>9.1f}"
                  f"{r['session / repeat']:>7.2f}{r['beside a plain feed / repeat']:>7.2f}"
                  f"{r['beside a Python feed / repeat']:>6.2f}{ms['python']:>8.2f}"
                  f"{ms['gateway']:>9.2f}{ranks['repeat']:>13}{ranks['session']:>13}"
                  f"{m['median_gateway_wakeups']:>7.1f}{m['median_input_wait_ms']:>9.2f}"
                  f"{1e3 / med['lockstep']:>13.2f}"
                  f"{m['median_latency_s'] * 1e3:>12.2f}{r['latency / lockstep frame']:>7.2f}")
        print(f"{models[0]['model']}'s frame ({copy['bytes']} bytes) out of shared memory "
              f"another process just wrote, on the other core: Open MPI's single copy "
              f"{copy['cma_us']:.1f} us, a memcpy of the memfd mapped {copy['memcpy_us']:.1f} us")
        long = long_stream(work, args.long) if args.long else None
        if long:
            print(f"figure 2, three kinds: {long['delivered']} of {long['frames']} frames in "
                  f"order, worst rel {long['worst_rel']:.2e}, {long['fps']:.0f} frames/s")
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"models": models, "long": long, "frame_copy": copy},
                                        indent=1) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
