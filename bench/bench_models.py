"""The models a benchmark names: zoo models, ONNX files, and Ultralytics' detectors.

A detector is one of tests/fidelity_export.py's (``yolo11n``): built from Ultralytics' yaml with
seeded weights and exported as Ultralytics exports it, at 640x640, the size it is trained and
run at. That takes torch and ultralytics, which ``make test`` does not install: the Python that
``make fidelity`` installs for the pinned torch does it (``$AUTODICE_TORCH_PYTHON`` names
another), once; the export is cached.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from autodice.backend.engine import cache_root
from autodice.frontend import zoo

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from fidelity_export import DETECTORS  # noqa: E402  (names only: it imports torch lazily)

DETECTOR_SIDE = 640
PINNED_TORCH = "2.15.0"  # the Makefile's first TORCH_RELEASES entry


def torch_python() -> Path:
    return Path(os.environ.get("AUTODICE_TORCH_PYTHON") or Path.home() / ".cache" / "autodice"
                / "torch" / PINNED_TORCH / "bin" / "python")


def exported(name: str) -> Path:
    return cache_root() / "bench" / f"{name}-{DETECTOR_SIDE}.onnx"


def can_export(name: str = "yolo11n") -> bool:
    """Whether the detector ``name`` was exported here, or can be."""
    return exported(name).exists() or torch_python().exists()


def model_path(name: str) -> Path:
    """``name``: an ONNX file, a detector (exported here once), else a zoo model."""
    if name.endswith(".onnx"):
        return Path(name)
    if name not in DETECTORS:
        return zoo.cached(name)
    path = exported(name)
    if not path.exists():
        python = torch_python()
        if not python.exists():
            sys.exit(f"{name}: exporting it takes torch and ultralytics: make fidelity installs "
                     f"them, or AUTODICE_TORCH_PYTHON names a Python that has them")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.onnx")
        subprocess.run([str(python), str(ROOT / "tests" / "fidelity_export.py"), name,
                        "torchscript", str(tmp), str(DETECTOR_SIDE)], check=True)
        os.replace(tmp, path)
    return path
