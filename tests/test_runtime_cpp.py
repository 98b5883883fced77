"""The C++ runtime builds against a real ncnn and MPI and passes its ctest suite.

The first run on a fresh machine builds ncnn for this CPU (see test_engine.py); later runs reuse
the cache under ~/.cache/autodice (or $AUTODICE_CACHE).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import shm_entries

from autodice.backend import engine

ROOT = Path(__file__).resolve().parent.parent


def _run(cmd: list[str], cwd: Path | None = None) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.mark.cpp
def test_runtime_builds_and_ctest_passes(tmp_path):
    ncnn = engine.ensure_ncnn()
    build = tmp_path / "build"
    _run(["cmake", "-S", str(ROOT), "-B", str(build), *engine.cmake_args(ncnn)])
    _run(["cmake", "--build", str(build), "--parallel", str(os.cpu_count() or 1)])
    before = shm_entries()
    out = _run(["ctest", "--test-dir", str(build), "--output-on-failure"])
    # a singleton's and the aborted runs' shared memory stayed in the build folder
    assert not shm_entries() - before
    summary = re.search(r"(\d+)% tests passed, (\d+) tests failed out of (\d+)", out)
    assert summary, out
    assert summary.group(2) == "0" and int(summary.group(3)) >= 5, out
