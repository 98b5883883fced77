"""``pip install .`` (not editable) into a new virtual environment, then the main job from a folder
outside the checkout: templates and runtime sources must come from the installed package, not
from the source tree. Dependencies come from the package index as a user's would (pip's cache
makes that quick after the first time); ncnn comes from the shared cache.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def sh(cmd: list, cwd: Path, env: dict, timeout: float = 900) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


@pytest.mark.cpp
def test_installed_package_runs_the_demo_outside_the_checkout(tmp_path):
    venv, work = tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    sh([sys.executable, "-m", "venv", venv], tmp_path, env)
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q"]
    # A copy of the source tree, so the install cannot point back at the checkout.
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis"))
    sh([*pip, f"{src}[engine]"], tmp_path, env)
    sh([*pip, "--no-deps", "pnnx==20261020"], tmp_path, env)
    shutil.rmtree(src)

    autodice = venv / "bin" / "autodice"
    where = sh([venv / "bin" / "python", "-c", "import autodice; print(autodice.__file__)"],
               work, env)
    assert str(venv) in where, where
    for f in ("mapping.json", "platform.txt"):  # the user's input files
        shutil.copy(ROOT / "specs" / "squeezenet" / f, work / f)
    sh([autodice, "zoo", "squeezenet", "-o", "squeezenet.onnx"], work, env)
    sh([venv / "bin" / "python", "-c", "import numpy as np; np.save('x.npy', "
        "np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32))"],
       work, env)
    sh([autodice, "split", "squeezenet.onnx", "-m", "mapping.json", "-p", "platform.txt",
        "-o", "out"], work, env)
    sh([autodice, "gen", "out"], work, env)
    sh([autodice, "build", "out"], work, env)
    said = sh([autodice, "run", "out", "--input", "x.npy", "--frames", "5", "--check"], work, env)
    assert "FAIL" not in said and "ok" in said, said
    stats = json.loads((work / "out" / "results" / "stats.json").read_text())
    assert stats["frames"] == 5 and stats["fps"] > 0
    sh([autodice, "view", "out", "-o", "report.html"], work, env)  # Plotly's bundle installed
    assert "Plotly" in (work / "report.html").read_text() and \
        (work / "report.html").stat().st_size > 1e6
    program = (work / "out" / "packages" / "edge01" / "program.cpp").read_text()
    assert str(ROOT) not in program


def test_every_package_is_listed_for_installation():
    """The package list in pyproject.toml is explicit (templates/ and runtime_cpp/ install under
    autodice.*), so a new sub-package is missing from a ``pip install .`` until it is added there:
    the slow test above finds that after minutes, this one at once."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for p in (ROOT / "autodice").rglob("__init__.py")}
    assert found - listed == set()
