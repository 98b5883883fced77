"""Report benchmark: the page of a 24-way DenseNet-121 split, written and drawn in a browser.

DenseNet-121 (full size, seeded weights, 668 layers to map) over split_bench's 24 keys (8 hosts
x 1 core, 3 cores, GPU; layers balanced by FLOPs), split once. Then, round after round, side by
side:

  view      ``autodice view OUT -o report.html``: a whole process, start to exit
  library   ``autodice.report.view_report`` in this process (no interpreter start-up)
  chromium  headless Debian chromium loading the page from disk until Plotly has drawn every
            plot (``--dump-dom`` after the page set ``data-rendered``), a whole process
  blank     the same chromium loading an empty page: what any page costs to open this way

Goals (issue 57): written in ≤ 2 s, drawn by headless Chromium in ≤ 3 s, ≤ 5 MB.
Run: ``make bench`` or ``python bench/report_bench.py [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from split_bench import platform_and_mapping

import autodice
from autodice.frontend import zoo
from autodice.report import view_report


def timed(cmd: list[str]) -> tuple[float, str]:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed: {proc.stderr[-500:]}")
    return time.perf_counter() - t, proc.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path, default=Path("build/bench/report.json"))
    args = ap.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        print("note: no chromium (make test installs it as root): report_bench skipped")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = work / "densenet121.onnx"
        zoo.save(zoo.materialize("densenet121", seed=0), model)
        platform, mapping = platform_and_mapping(model, work)
        autodice.split(model, mapping, platform, work / "out")
        page, blank = work / "report.html", work / "blank.html"
        blank.write_text("<!DOCTYPE html><html><body data-rendered='true'></body></html>")
        browser = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                   f"--user-data-dir={work / 'chromium'}", "--virtual-time-budget=20000",
                   "--dump-dom"]
        times: dict[str, list[float]] = {k: [] for k in ("view", "library", "chromium", "blank")}
        for k in range(args.rounds):
            times["view"].append(timed([sys.executable, "-m", "autodice", "view",
                                        str(work / "out"), "-o", str(page)])[0])
            t = time.perf_counter()
            view_report(work / "out", page)
            times["library"].append(time.perf_counter() - t)
            seconds, dom = timed([*browser, page.as_uri()])
            if 'data-rendered="true"' not in dom:
                raise SystemExit("chromium did not finish drawing the page")
            times["chromium"].append(seconds)
            times["blank"].append(timed([*browser, blank.as_uri()])[0])
            print(f"round {k + 1}: " + ", ".join(f"{n} {v[-1]:.2f} s" for n, v in times.items()),
                  file=sys.stderr)
        data = json.loads(page.read_text().split('id="report-data">', 1)[1]
                          .split("</script>", 1)[0])
        nodes, layers = len(data["partition"]["nodes"]), data["partition"]["layers"]
        size = page.stat().st_size
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"DenseNet-121, 24 keys: {layers} layers drawn as {nodes} nodes; "
          f"page {size / 1e6:.2f} MB")
    print(f"{'':10}{'median s':>10}")
    for k, v in med.items():
        print(f"{k:10}{v:10.3f}")
    print(f"chromium on the page / on a blank page: {med['chromium'] / med['blank']:.2f}x")
    goals = [{"goal": "autodice view writes the page in ≤ 2 s", "value": med["view"],
              "shown": f"{med['view']:.2f} s", "ok": med["view"] <= 2.0},
             {"goal": "headless Chromium draws it in ≤ 3 s", "value": med["chromium"],
              "shown": f"{med['chromium']:.2f} s", "ok": med["chromium"] <= 3.0},
             {"goal": "the page is ≤ 5 MB", "value": size, "shown": f"{size / 1e6:.2f} MB",
              "ok": size <= 5e6}]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"model": "densenet121", "keys": 24, "layers": layers,
                                     "nodes": nodes, "bytes": size, "rounds": args.rounds,
                                     "seconds": times, "median_s": med, "goals": goals},
                                    indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
