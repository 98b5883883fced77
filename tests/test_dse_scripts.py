"""The runnable scripts in dse/ run end to end in their fast mode, so they never rot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.cpp  # they profile on the real engine


def script(name: str, *args, timeout: float = 900) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "dse" / name), "--fast", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_pareto_search_writes_a_front_under_the_memory_cap(tmp_path):
    said = script("pareto_search.py", "--out", tmp_path / "front", "--max-memory", "200MB")
    doc = json.loads((tmp_path / "front" / "pareto.json").read_text())
    assert doc["points"] and all(p["memory_bytes"] <= 200e6 for p in doc["points"])
    assert (tmp_path / "front" / "pareto.png").stat().st_size > 0
    assert "fastest:" in said and "least memory:" in said


def test_bandwidth_sweep_finds_where_splitting_stops_paying(tmp_path):
    script("bandwidth_sweep.py", "--out", tmp_path)
    rows = json.loads((tmp_path / "sweep.json").read_text())
    slow, fast = rows[0], rows[-1]
    assert (slow["bandwidth"], fast["bandwidth"]) == ("10mbit", "10gbit")
    # Faster links never make the best mapping slower, and let it move more between boards.
    assert fast["throughput_fps"] >= slow["throughput_fps"]
    assert fast["bytes_between_boards"] >= slow["bytes_between_boards"]
    # Every layer on one board is among what the search starts from: it never ends below that.
    assert all(r["throughput_fps"] >= r["one_device_fps"] for r in rows if r["one_device_fits"])
    assert (tmp_path / "sweep.png").stat().st_size > 0


@pytest.mark.skipif(os.geteuid() != 0, reason="the emulated cluster needs root")
def test_measure_front_on_the_emulated_cluster(tmp_path):
    said = script("measure_front.py", "--out", tmp_path / "measured", "--points", 1)
    rows = json.loads((tmp_path / "measured" / "measure.json").read_text())
    assert len(rows) == 1 and rows[0]["measured_fps"] > 0
    assert "measured on the emulated cluster" in said
