"""The performance goals in one table, read from what the benchmarks wrote under build/bench/.

    python bench/goals.py [--dir build/bench] [--json build/bench/goals.json]

Each row: the goal, the figure measured (medians side by side in one run of its benchmark),
✔ or ✘, and for a ✘ the measured figure that limits it. A benchmark that has not run (no JSON)
is one line saying so; `make bench` runs them all, then this.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Callable, Iterator, NamedTuple


class Goal(NamedTuple):
    area: str
    goal: str
    measured: str
    ok: bool
    why: str = ""


def stage_times(m: dict) -> str:
    """The 2x1 sub-models' ms a frame as plain processes, beside the ranks' compute: an uneven
    cut shows in both, what the program adds only in the ranks'."""
    free = m["stages ms a frame"]["2 stages free"]
    return f" (as plain processes, stage 0 {free[0]:.1f}, stage 1 {free[1]:.1f} ms)"


def cut_share(m: dict) -> str:
    """What the cut allows by the profile: half the model against the slower stage (layers do
    not divide evenly), so a figure the stages as plain processes can be read against."""
    cut = m["2x1 cut by the profile"]
    slower = max(cut["stage_ms"])
    return (f"; the profile's best cut has a {slower:.1f} ms stage for a {cut['whole_ms']:.1f} ms "
            f"model, {cut['whole_ms'] / 2 / slower:.2f}x of it at most")


def paired_runs(m: dict) -> str:
    """How many paired runs a backend ratio is the median of."""
    pairs = m["pairs"]
    return (f"{m['rounds'] * pairs} pairs' ratios ({m['rounds']} rounds of {pairs})" if pairs > 1
            else f"{m['rounds']} rounds' ratios")


def backend(d: dict) -> Iterator[Goal]:
    """P4 (pipeline scaling, overhead) and P5 (tensor transfer on one host)."""
    for m in d["models"]:
        r, name = m["ratios"], m["model"]
        still = m["median_steady_fps"]
        ranks = "; ".join(f"rank {k} compute {x['compute_s'] * 1e3:.1f} ms, waits "
                          f"{(x['recv_wait_s'] + x['send_wait_s']) * 1e3:.1f} ms"
                          for k, x in enumerate(m["2x1 per frame"]))
        share, own = r["steady 2x1 / 2 alone"], r["steady 2x1 / 2 stages pipelined"]
        spread = {k: statistics.median(v) for k, v in m["core_spread"].items()}
        slowest = max(x["compute_s"] for x in m["2x1 per frame"])
        piped, pace = r["steady 2 stages pipelined / 2 alone"], 1 / slowest / still["2 alone"]
        # A limit where both ways stay below the goal: the same cut as a plain pipeline (nothing
        # of autodice), and the program's slower rank had it never waited.
        lead = "Limit, two ways" if max(piped, pace) < 0.95 else "No limit both ways agree on"
        yield Goal("P4", f"{name} 2 ranks x 1 thread >= 0.95x two whole-model ncnn processes at "
                   "once (steady state)", f"{share:.2f}x", share >= 0.95,
                   f"{still['2x1']:.1f} vs {still['2 alone']:.1f} frames/s, median of "
                   f"{paired_runs(m)}. {lead}: 2x1's own two sub-models as plain ncnn "
                   f"processes at once (stages_alone.cpp), tied by their data with the "
                   f"program's frames in flight, make {piped:.2f}x of it "
                   f"({r['steady 2 stages free / 2 alone']:.2f}x each at its own pace, "
                   f"{r['steady 2 stages meeting / 2 alone']:.2f}x in lockstep); the program's "
                   f"slower rank computes {slowest * 1e3:.1f} ms a frame, {pace:.2f}x of it "
                   f"were there no wait at all{stage_times(m)}{cut_share(m)}. Slower / faster "
                   f"core, medians: two ncnn processes {spread['ncnn processes']:.2f}, a float "
                   f"loop per core (core_speeds.c) {spread['core_speeds']:.2f}; per frame: "
                   f"{ranks}")
        yield Goal("P4", f"{name} 2 ranks x 1 thread >= 0.95x its two sub-models as a plain "
                   "ncnn pipeline, the same frames in flight (what autodice adds to a pipeline)",
                   f"{own:.2f}x", own >= 0.95,
                   f"{still['2x1']:.1f} vs {still['2 stages pipelined']:.1f} frames/s, median "
                   f"of {paired_runs(m)}; against the stages in lockstep "
                   f"{r['steady 2x1 / 2 stages meeting']:.2f}x")
        # 1.05x where the ceiling allows it: where two whole-model processes at once make less
        # than 1.05 / 0.95 of 1x2, 2x1 is held to the share of them the first row asks.
        versus, room = r["steady 2x1 / 1x2"], r["steady 2 alone / 1x2"]
        need = min(1.05, 0.95 * room)
        yield Goal("P4", f"{name} 2 ranks x 1 thread >= 1.05x 1 rank x 2 threads where the "
                   "ceiling allows it, else >= 0.95x of what it allows (steady state)",
                   f"{versus:.2f}x", versus >= need,
                   f"needs {need:.2f}x: the ceiling, two whole-model processes at once, makes "
                   f"{room:.2f}x of 1x2, 2x1's sub-models as a plain pipeline "
                   f"{r['steady 2 stages pipelined / 1x2']:.2f}x; "
                   f"{still['2x1']:.1f} vs {still['1x2']:.1f} frames/s, "
                   f"median of {paired_runs(m)}; over {m['frames']} frames, filling "
                   f"and draining, {r['2x1 / 1x2']:.2f}x; per frame: {ranks}")
        one, alone = m["fps"]["1x1"], m["fps"]["alone"]
        yield Goal("P4", f"{name} 1 rank = plain ncnn loop (>= 0.97x)",
                   f"{r['1x1 / ncnn alone']:.2f}x", r["1x1 / ncnn alone"] >= 0.97,
                   f"median of {paired_runs(m)}, the two back to back, which first "
                   f"alternating (ratio of the medians {r['1x1 / ncnn alone, medians']:.2f}x); "
                   f"run by run, 1 rank {min(one):.1f}-{max(one):.1f} frames/s, the plain "
                   f"loop {min(alone):.1f}-{max(alone):.1f}")
    wire = d["wire"]
    for w in wire["rows"]:
        # From half a MiB, where the bytes decide and not the calls: 1-64 MiB and the padded
        # 1x64x55x55 (each channel's plane padded to 16 bytes in ncnn's Mat).
        if w["bytes"] < 2**19:
            continue
        pair, tensor = w["paired"], f"{w['shape']} ({w['bytes'] / 2**20:.2g} MiB)"
        beside, alone = pair["mpi / transfer"], pair["mpi_alone / wire_alone"]
        yield Goal("P5", f"{tensor} between 2 ranks >= 0.9x the same bytes by MPI calls beside "
                   "it (in turns, one launch)", f"{beside:.2f}x", beside >= 0.9,
                   f"MPI (single copy: {wire['smsc']}) moves it at "
                   f"{w['copy_us'] / w['mpi_us']:.2f} of a cross-core copy; median of "
                   f"{wire['rounds']} launches' ratios")
        yield Goal("P5", f"{tensor} between 2 ranks >= 0.9x the same bytes by MPI calls, each "
                   "alone (one buffer pair, as a plain ping-pong)", f"{alone:.2f}x",
                   alone >= 0.9, f"one way {w['wire_alone_us']:.0f} vs {w['mpi_alone_us']:.0f} "
                   f"us, medians over launches; median of {wire['pairs']} rounds' ratios")
        agree = pair["plain_mpi / mpi_alone"]
        yield Goal("P5", f"{tensor}: those calls alone within 10 % of a plain MPI program "
                   "(mpi_pingpong.c)", f"{agree:.2f}x", abs(agree - 1) <= 0.1,
                   f"one way {w['mpi_alone_us']:.0f} vs {w['plain_mpi_us']:.0f} us, medians over "
                   f"launches; median of {wire['pairs']} rounds' ratios (launched back to back)")


def parallel(d: dict) -> Iterator[Goal]:
    """Issue 14: horizontal split memory, stage copies."""
    split = d["vgg_memory"]["rows"]["fc split by channels"]
    yield Goal("parallel", "VGG-19, FC split by channels over 4 keys: largest rank <= 35 % of the "
               "weights", f"{split['largest_params_share']:.0%} (RSS "
               f"{split['largest_rss_share']:.0%})", split["largest_params_share"] <= 0.35)
    p = d["pipeline"]
    yield Goal("parallel", "ResNet-50 body copied once: >= 1.6x frames/s (with enough cores)",
               f"{p['ratio']:.2f}x", p["ratio"] >= 1.6,
               f"4 ranks on {p['cores']} cores" if p["cores"] < 4 else "")


def computing(m: dict, ms: dict) -> str:
    """What the ranks computed a frame in the session against the repeat (wall time by their
    own clocks): each rank since 2026-11-27's later runs, their sum before."""
    if "median_compute_ms" in m:
        rep, ses = (m["median_compute_ms"][k] for k in ("repeat", "session"))
        each = ", ".join(f"rank {k} {s:.2f} ms ({r:.2f} in the repeat)"
                         for k, (r, s) in enumerate(zip(rep, ses)))
        return f"inside ncnn {each}, the slower stage setting the pace"
    return (f"inside ncnn the ranks spent {ms['ranks computing']:.2f} ms, "
            f"{ms['repeat computing']:.2f} in the repeat (wall time, their own clocks)")


def session(d: dict) -> Iterator[Goal]:
    """Issue 22: frames fed from Python against the program's own repeat, latency, order."""
    for m in d["models"]:
        r, med = m["ratios"], m["median_fps"]
        why = f"repeat {med['repeat']:.1f} frames/s, session {med['session']:.1f}"
        ms = m.get("median_ms_a_frame")
        if ms:  # where a frame's time went while the session streamed (since 2026-11-26)
            why = (f"steady, {why}, median of {m['rounds']} rounds' ratios, {m['frames']} frames "
                   f"a stream. Per frame while it streamed: the {m['cores']} cores gave "
                   f"{1e3 * m['cores'] / med['session']:.2f} ms at the session's rate; the feed "
                   f"took {ms['python']:.2f} ms of CPU in Python and {ms['gateway']:.2f} in the "
                   f"gateway, the ranks' processes {ms['ranks']:.2f} (/proc, waiting included); "
                   + computing(m, ms))
        if "median_gateway_wakeups" in m:  # since 2026-11-27
            why += (f"; frames went through {m['frames_via']}, the gateway woke "
                    f"{m['median_gateway_wakeups']:.1f} times a frame on rank 0's core")
        if "beside a plain feed / repeat" in r:  # the plain feed: since 2026-11-26
            plain = r["beside a plain feed / repeat"]
            wait = m["median_input_wait_ms"]
            why += (f". Rank 0 waited {wait:.3f} ms a frame for its frames (the gateway's word "
                    f"and the bytes: {wait * med['session'] / 10:.1f} % of the session's frame "
                    f"time). The repeat beside a plain feed (plain_feed.c: "
                    f"the same bytes through a Unix socket at the session's rate, nothing of "
                    f"autodice or Python in it) made {plain:.2f}x: "
                    + ("below the goal with no feed of autodice's at all (one method, a plain "
                       "program)" if plain < 0.9 else
                       "not a limit, the machine leaves a feed room for the goal; the rest is "
                       "the session's own feed (Python, the gateway) and the ranks' computing "
                       "slowed beside it"))
        elif ms:
            why += (". Not a limit: the feed's time, and the ranks' computing slowed beside it, "
                    "are the session's own")
        if "beside a Python feed / repeat" in r:  # since 2026-11-27
            py = r["beside a Python feed / repeat"]
            why += (f". Beside a bare Python feed (python_feed.py: the same bytes into shared "
                    f"slots from one Python loop, nothing of autodice) the repeat made {py:.2f}x"
                    + (": Python feeding at all leaves less than the goal (one method, a plain "
                       "Python program)" if py < 0.9 else
                       ": Python feeding at all leaves room for the goal"))
        yield Goal("stream", f"{m['model']} session >= 0.9x run --frames on one frame",
                   f"{r['session / repeat']:.2f}x", r["session / repeat"] >= 0.9, why)
        yield Goal("stream", f"{m['model']} latency one at a time <= 1.1x a lockstep frame",
                   f"{r['latency / lockstep frame']:.2f}x", r["latency / lockstep frame"] <= 1.1,
                   f"latency {m['median_latency_s'] * 1e3:.2f} ms, lockstep frame "
                   f"{1e3 / med['lockstep']:.2f} ms")
    if d.get("long"):
        lo = d["long"]
        yield Goal("stream", f"{lo['frames']} distinct frames, 4 ranks with a replica: all in "
                   "order, equal to onnxruntime", f"{lo['delivered']} ok" if lo["ok"] else
                   f"{lo['delivered']}", lo["ok"], f"worst rel {lo['worst_rel']:.1e}")


def recovery(d: dict) -> Iterator[Goal]:
    """Issue 23: a host killed mid-stream, to the first new result (3 -> 2 emulated hosts)."""
    for name, what in (("ready", "with the fallback prepared ahead"), ("cold", "without")):
        m = d["summary"][name]
        yield Goal("recover", f"{d['model']}, a host killed: first new result {what} "
                   f"<= {m['goal_s']:g} s", f"{m['kill_to_first_result_s']:.2f} s",
                   m["kill_to_first_result_s"] <= m["goal_s"],
                   f"detect {m['detect_s']:.2f}, plan {m['plan_s']:.2f}, deploy "
                   f"{m['deploy_s']:.2f}, restart {m['restart_s']:.2f} s")
        yield Goal("recover", f"{d['model']} {name}: frames sent again <= frames in flight",
                   f"{m['replayed_max']} <= {m['in_flight_max']}",
                   m["replayed_max"] <= m["in_flight_max"])


def arm(d: dict) -> Iterator[Goal]:
    """Issues 21 and 56: an x86 host and emulated aarch64 boards, one on an older OS."""
    redeploys = d["redeploy_s"] if isinstance(d["redeploy_s"], dict) else {
        "aarch64": d["redeploy_s"]}  # an arm.json written before the bullseye board
    for kind, median in redeploys.items():
        yield Goal("ARM", f"redeploy x86 + {kind} board, nothing changed (2 hosts) <= 1.0 s",
                   f"{median:.2f} s", median <= d["redeploy_goal_s"])
    first = d.get("first_deploy_empty_cache_s")
    if first:
        extra = first["aarch64:bullseye"] - first["aarch64"]
        yield Goal("ARM", "first deploy to a bullseye board <= 30 s more than to a bookworm one",
                   f"{extra:+.0f} s ({first['aarch64:bullseye']:.0f} vs {first['aarch64']:.0f} s)",
                   extra <= d["first_deploy_extra_goal_s"])
    build = d.get("ncnn_build_s")
    if build:
        yield Goal("ARM", "ncnn cross build for aarch64 <= this machine's native build",
                   f"{build['aarch64 cross']:.0f} s vs {build['native']:.0f} s",
                   build["aarch64 cross"] <= build["native"])


def deploy(d: dict) -> Iterator[Goal]:
    """P7 (redeploy) and P5's link half."""
    for r in d["deploy"]:
        if r["goal_s"] is None:
            continue
        steps = ", ".join(f"{k} {v:.2f}" for k, v in r["steps_s"].items())
        yield Goal("P7", f"{r['what']} ({r['hosts']} hosts) <= {r['goal_s']:g} s",
                   f"{r['median_s']:.2f} s", r["met"], f"steps (s): {steps}")
    for r in d["link"]:
        if r["bytes"] >= 16 * 2**20:
            yield Goal("P5", f"{r['shape']} over a 1 Gbit/s link >= 90 % of its rate",
                       f"{r['of_shaped_rate']:.0%}", r["of_shaped_rate"] >= 0.9)


def split(d: dict) -> Iterator[Goal]:
    """P1: the front end against a plain copy of the model file."""
    for r in d["results"]:
        for g in r["goals"]:
            yield Goal("P1", f"{r['model']}: {g['goal']}", g["shown"], g["ok"], g["why"])


def listed(area: str) -> Callable[[dict], Iterator[Goal]]:
    """A benchmark that writes its goals as a list, each with its figure as shown and ✔/✘."""
    def read(d: dict) -> Iterator[Goal]:
        for g in d["goals"]:
            yield Goal(area, g["goal"], g["shown"], g["ok"])
    return read


def costmodel(d: dict) -> Iterator[Goal]:
    """P6: the cost model's predictions at the Pareto points `dse --measure` ran."""
    where = f"{d['hosts']} emulated hosts x {d['cores_per_host']} core"
    for m in d["models"]:
        for what, key, limit in (("frames/s", "fps_error", 0.15),
                                 ("peak memory", "memory_error", 0.10)):
            errors = [p[key] for p in m["points"]]
            worst = max(m["points"], key=lambda p: abs(p[key]))
            why = (f"{worst['point']}: predicted {worst['predicted_fps']:.2f} frames/s, "
                   f"{worst['predicted_memory_bytes'] / 1e6:.0f} MB; measured "
                   f"{worst['measured_fps']:.2f} (rounds {min(worst['runs_fps']):.2f}-"
                   f"{max(worst['runs_fps']):.2f}), {worst['measured_memory_bytes'] / 1e6:.0f} MB")
            if "layers_ms_after" in m:
                why += (f"; the layers on one core summed {m['layers_ms_before']:.1f} ms in the "
                        f"profile it predicts from, {m['layers_ms_after']:.1f} ms in one taken "
                        "after the runs")
            if key == "fps_error" and "paced_fps_error" in worst:
                why += "; " + paced(m["points"], worst, limit)
            yield Goal("P6", f"{m['model']}: predicted {what} within {limit:.0%} at every "
                       f"measured point ({where})",
                       f"{min(errors):+.0%}..{max(errors):+.0%}",
                       max(abs(e) for e in errors) <= limit, why)


def paced(points: list[dict], worst: dict, limit: float) -> str:
    """A frames/s miss measured a second way: each round at its hosts' pace that round (the
    whole model alone on each host, run in the same round), which takes out how far the
    machine's pace moved between the profile and that round. "Limit" only where that way every
    point is within ``limit`` and the hosts' pace itself moved more than the miss."""
    errors = [p["paced_fps_error"] for p in points]
    paces = worst["runs_pace"]
    text = (f"at its hosts' pace in each round (the whole model alone on each, beside the points) "
            f"{min(errors):+.0%}..{max(errors):+.0%}; {worst['point']}'s hosts ran at "
            f"{min(paces):.2f}-{max(paces):.2f}x their profile over its rounds")
    moved = max(paces) / min(paces) - 1
    if max(abs(e) for e in errors) <= limit and moved > abs(worst["fps_error"]) - limit:
        return "limit, two ways: the machine's pace moved within the run; " + text
    return "no limit both ways agree on: " + text


def dse(d: dict) -> Iterator[Goal]:
    yield Goal("DSE", f"{d['evaluations']} NSGA-II evaluations on DenseNet-121 <= "
               f"{d['goal_s']:g} s", f"{d['search_s']:.1f} s", d["search_s"] <= d["goal_s"])
    yield Goal("DSE", "the front dominates 1,000 random valid mappings",
               f"{d['dominated_weakly']:.1%}", d["dominated_weakly"] >= 1.0)


def detect(d: dict) -> Iterator[Goal]:
    yield Goal("52", "a YOLO11n head's boxes, a typical frame <= 1 ms",
               f"{d['boxes_typical_ms']:.2f} ms", d["boxes_typical_ms"] <= 1.0)
    if "masks_ms" in d:
        yield Goal("52", f"YOLO11n-seg's boxes and {d['masks_kept']} instance masks in a 720p "
                   "picture <= 5 ms", f"{d['masks_ms']:.2f} ms", d["masks_ms"] <= 5.0)


def video(d: dict) -> Iterator[Goal]:
    for r in d["sides"]:
        ratio, alone = r["ratio_to_batch"]["video, boxes"], r["fps_median"]["feed alone"]
        yield Goal("52", f"{r['model']}: a 720p clip's --task detect session >= 0.9x the same "
                   "frames from .npy", f"{ratio:.2f}x", ratio >= 0.9,
                   f"the feed alone: {alone:.0f} frames/s on a core; the 2 ranks hold both")


def int8(d: dict) -> Iterator[Goal]:
    for name, rows in d["models"].items():
        r = rows["1x1"]
        yield Goal("55", f"{name}: int8 model bytes <= 0.3x fp32", f"{r['bytes_ratio']:.2f}x",
                   r["bytes_ratio"] <= 0.3, "gen keeps its first and most sensitive layers fp32")


def wire(d: dict) -> Iterator[Goal]:
    fp16 = next(r for r in d["rows"] if r["wire"] == "fp16")
    yield Goal("55", f"{d['model']} over a {d['rate']} link: --wire fp16 >= "
               f"{d['goal_fp16_vs_fp32']}x fp32's frames/s", f"{fp16['vs_fp32']:.2f}x", d["met"],
               f"the link allows {fp16['link_bound_fps']:.0f} frames/s in fp16")


READERS: dict[str, Callable[[dict], Iterator[Goal]]] = {
    "split": split, "backend": backend, "parallel": parallel, "deploy": deploy, "dse": dse,
    "costmodel": costmodel, "session": session, "recovery": recovery, "arm": arm,
    "report": listed("57"), "metrics": listed("57"), "boards": listed("57"),
    "check": listed("53"), "detect": detect, "video": video, "int8": int8, "wire": wire}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("build/bench"))
    ap.add_argument("--json", type=Path, default=None, help="default: DIR/goals.json")
    args = ap.parse_args()
    goals, missing = [], []
    for name, read in READERS.items():
        path = args.dir / f"{name}.json"
        if path.exists():
            goals += read(json.loads(path.read_text()))
        else:
            missing.append(f"{path} (bench/{name}_bench.py has not run)")
    width = max((len(g.goal) for g in goals), default=10)
    for g in goals:
        print(f"{'✔' if g.ok else '✘'} {g.area:<8} {g.goal:<{width}} {g.measured:>12}"
              + ("" if g.ok or not g.why else f"   {g.why}"))
    for m in missing:
        print(f"- not measured: {m}")
    print(f"{sum(g.ok for g in goals)} of {len(goals)} goals met")
    out = args.json or args.dir / "goals.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"goals": [g._asdict() for g in goals], "missing": missing},
                              indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
