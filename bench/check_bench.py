"""``layers --check`` benchmark (issue 53): will DenseNet-121 run in ncnn, asked cold and again.

    python bench/check_bench.py [--rounds 3] [--model densenet121]

Each round, a whole ``autodice layers MODEL --check`` process, timed start to exit:

  cold    an empty cache (``AUTODICE_CACHE`` a new folder): no conversion and no answer kept.
          ncnn and its checker are what ``make`` installs once, so they are pointed at
          (``AUTODICE_NCNN_DIR``, the checker's cache entry linked in), not rebuilt
  cached  the same question again: the answer is read from the cache

Goals: cold ≤ 30 s, cached ≤ 1 s. Writes build/bench/check.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autodice.backend.engine import ensure_ncnn
from autodice.backend.tools import build_tools
from autodice.frontend import zoo


def timed(cmd: list[str], env: dict) -> tuple[float, str]:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    seconds = time.perf_counter() - t
    if proc.returncode not in (0, 1):
        raise SystemExit(f"layers --check failed: {proc.stderr[-800:]}")
    return seconds, proc.stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default="densenet121")
    ap.add_argument("--json", type=Path, default=Path("build/bench/check.json"))
    args = ap.parse_args()
    ncnn = ensure_ncnn()
    tools = build_tools(ncnn)
    times: dict[str, list[float]] = {"cold": [], "cached": []}
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / f"{args.model}.onnx"
        zoo.save(zoo.materialize(args.model, seed=0), model)
        cmd = [sys.executable, "-m", "autodice", "layers", str(model), "--check"]
        said = ""
        for k in range(args.rounds):
            cache = Path(tmp) / f"cache{k}"
            (cache / "tools").mkdir(parents=True)
            (cache / "tools" / tools.name).symlink_to(tools)
            env = {**os.environ, "AUTODICE_CACHE": str(cache), "AUTODICE_NCNN_DIR": str(ncnn)}
            for kind in ("cold", "cached"):
                seconds, said = timed(cmd, env)
                times[kind].append(seconds)
            print(f"round {k + 1}: cold {times['cold'][-1]:.1f} s, cached "
                  f"{times['cached'][-1]:.2f} s", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(said)
    print(f"{args.model}: layers --check cold {med['cold']:.1f} s, cached {med['cached']:.2f} s "
          f"(medians of {args.rounds})")
    goals = [{"goal": f"layers --check on {args.model}, empty cache, ≤ 30 s",
              "value": med["cold"], "shown": f"{med['cold']:.1f} s", "ok": med["cold"] <= 30},
             {"goal": f"layers --check on {args.model}, cached, ≤ 1 s", "value": med["cached"],
              "shown": f"{med['cached']:.2f} s", "ok": med["cached"] <= 1}]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"model": args.model, "seconds": times, "median_s": med,
                                     "answer": said, "goals": goals}, indent=1,
                                    ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
