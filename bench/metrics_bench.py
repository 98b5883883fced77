"""Metrics benchmark (issue 57): a SqueezeNet session's frames/s with /metrics served and
scraped against the same session without them.

    python bench/metrics_bench.py [--frames 1500] [--rounds 15] [--scrape-every 1.0]

SqueezeNet (seeded weights) over 2 ranks x 1 thread on this machine's two cores, cut as
``autodice layers --balance`` cuts. Each round streams ``--frames`` frames twice, side by side
and in turns (the order alternating): ``off`` (``autodice.open(out)``) and ``on``
(``autodice.open(out, metrics=":PORT")`` with a scraper reading /metrics every
``--scrape-every`` seconds: fifteen times Prometheus' default pace). The ranks send their live
figures to the gateway about every second in both: that is part of the program, not of serving
them. Compared: the steady frames/s of each, the median of the rounds' on/off ratios.

Goal: on ≥ 0.99x off. Writes build/bench/metrics.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import socket
import statistics
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from backend_bench import prepare  # noqa: E402

import autodice  # noqa: E402
from autodice.core.model import load_model  # noqa: E402
from autodice.dse.balance import balance  # noqa: E402
from autodice.frontend import zoo  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stream(out: Path, xs: list, frames: int, scrape_every: float | None) -> tuple[float, int]:
    """Steady frames/s of ``frames`` frames through a session, and how many scrapes read
    /metrics meanwhile (``scrape_every`` None: metrics off)."""
    port = free_port() if scrape_every else None
    done, scrapes = threading.Event(), []

    def scraper():
        while not done.wait(scrape_every):
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
            scrapes.append(b"autodice_rank_compute_seconds_total" in text)

    with autodice.open(out, metrics=f":{port}" if port else None) as s:
        thread = threading.Thread(target=scraper) if port else None
        if thread:
            thread.start()
        try:
            list(s.map(itertools.islice(itertools.cycle(xs), frames)))
        finally:
            done.set()
            if thread:
                thread.join()
    return s.stats()["steady_fps"], sum(scrapes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--scrape-every", type=float, default=1.0)
    ap.add_argument("--json", type=Path, default=Path("build/bench/metrics.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = work / "squeezenet.onnx"
        zoo.save(zoo.materialize("squeezenet", seed=0), model)
        mapping = balance(load_model(model), model, ["edge01_x860", "edge01_x861"]).mapping
        out = prepare(model, mapping, work / "squeezenet")
        shape = autodice.plan(model, mapping, work / "squeezenet" / "platform.txt") \
            .model_inputs[0].shape
        rng = np.random.default_rng(0)
        xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(60)]
        stream(out, xs, args.frames // 4, None)  # caches warm
        fps: dict[str, list[float]] = {"off": [], "on": []}
        ratios, scraped = [], []
        for k in range(args.rounds):
            for arm in (("off", "on") if k % 2 == 0 else ("on", "off")):
                rate, n = stream(out, xs, args.frames,
                                 args.scrape_every if arm == "on" else None)
                fps[arm].append(rate)
                if arm == "on":
                    scraped.append(n)
            ratios.append(fps["on"][-1] / fps["off"][-1])
            print(f"round {k + 1}: off {fps['off'][-1]:.1f}, on {fps['on'][-1]:.1f} frames/s "
                  f"({scraped[-1]} scrapes, each with the ranks' figures)", file=sys.stderr)
    ratio = statistics.median(ratios)
    print(f"SqueezeNet, 2 ranks, {args.frames} frames a stream, {args.rounds} paired rounds")
    print(f"metrics off  {statistics.median(fps['off']):8.1f} frames/s (median)")
    print(f"metrics on   {statistics.median(fps['on']):8.1f} frames/s (median), scraped every "
          f"{args.scrape_every:g} s")
    print(f"on / off     {ratio:8.3f} (median of the rounds' ratios; goal ≥ 0.99)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "model": "squeezenet", "frames": args.frames, "rounds": args.rounds,
        "scrape_every_s": args.scrape_every, "fps": fps, "ratios": ratios, "scrapes": scraped,
        "goals": [{"goal": "SqueezeNet session with /metrics scraped keeps ≥ 0.99x frames/s",
                   "value": ratio, "shown": f"{ratio:.3f}x", "ok": ratio >= 0.99}]},
        indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
