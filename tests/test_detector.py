"""A detector's shape through the whole chain without torch: ``graphs.yolo_like`` (three scales,
the neck's Resize and Concat, heads flattened and concatenated, the Split of boxes and scores,
DFL's softmax, anchors) split over three keys with cuts where detectors are cut, gen'd, built
and run under mpirun, equal to onnxruntime."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from graphs import yolo_like

import autodice
from autodice.core.model import load_model

pytestmark = pytest.mark.cpp


def test_a_yolo_shaped_detector_cut_in_its_neck_and_head_runs_like_onnxruntime(tmp_path):
    onnx.save(yolo_like(), tmp_path / "model.onnx")
    names = load_model(tmp_path / "model.onnx").layer_names
    backbone = names[:names.index("b4") + 1]
    rest = names[len(backbone):]
    last_scale = [n for n in rest if n.startswith("h2")]
    # Key 1 takes the neck and two heads up to the Split, and the DFL's softmax; key 2 the last
    # scale's head and what follows the Split: the multi-scale Concat, the Split and the DFL
    # each have a tensor on the wire (the DFL's there and back).
    middle = [n for n in rest[:rest.index("split") + 1] if n not in last_scale] + ["dfl.s"]
    mapping = {"edge01_cpu0": backbone, "edge02_cpu1": middle,
               "edge03_cpu0": [n for n in rest if n not in middle]}
    (tmp_path / "mapping.json").write_text(json.dumps(mapping))
    (tmp_path / "platform.txt").write_text("edge01, cpu, slots=0\nedge02, cpu, slots=1\n"
                                           "edge03, cpu, slots=0\n")
    plan = autodice.split(tmp_path / "model.onnx", tmp_path / "mapping.json",
                          tmp_path / "platform.txt", tmp_path / "out")
    assert {"h2.flat", "box", "cls", "dfl.t", "dfl.s"} <= {e.tensor for e in plan.edges}
    autodice.gen(tmp_path / "out")
    autodice.build(tmp_path / "out")
    x = np.random.default_rng(0).random((1, 3, 64, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    got = autodice.run(tmp_path / "out", {"images": tmp_path / "x.npy"}, frames=3)
    want = ort.InferenceSession(str(tmp_path / "model.onnx")).run(None, {"images": x})[0]
    out = got.outputs["output0"]
    assert out.shape == want.shape == (1, 12, 84)
    assert np.abs(out - want).max() <= 1e-4 * np.abs(want).max()
