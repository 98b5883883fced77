"""The example scripts in examples/ run end to end, so they never rot."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from PIL import Image

from autodice.backend.session.frames import frames_from

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.cpp


@pytest.mark.skipif(os.geteuid() != 0, reason="the emulated cluster needs root")
def test_classify_images_on_two_emulated_boards(tmp_path):
    """Images made here (no downloads), one of them broken; each gets the class onnxruntime
    gives the whole model on the same preprocessed image, in folder order."""
    images = tmp_path / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for i, size in enumerate([(224, 224), (320, 240), (200, 300), (256, 256)]):
        pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
        Image.fromarray(pixels).save(images / f"img{i}.{'png' if i % 2 else 'jpg'}")
    (images / "broken.png").write_bytes(b"not an image")
    (tmp_path / "labels.txt").write_text("".join(f"label-{k}\n" for k in range(1000)))
    work = tmp_path / "work"
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "classify_images.py"),
                           str(images), "--labels", str(tmp_path / "labels.txt"),
                           "--work", str(work)],
                          capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = dict(re.findall(r"^(\S+): (.*)$", proc.stdout, re.M))
    whole = ort.InferenceSession(str(work / "squeezenet.onnx"))
    name = whole.get_inputs()[0].name
    _, frames = frames_from(str(images), (1, 3, 224, 224), np.dtype(np.float32))
    for label, frame in frames:
        if label == "broken.png":
            assert "cannot make a frame of it" in said[label]
            continue
        best = int(whole.run(None, {name: frame})[0].reshape(-1).argmax())
        assert said[label].startswith(f"label-{best} ("), (label, said[label])
    assert list(said)[:5] == ["broken.png", "img0.jpg", "img1.png", "img2.jpg", "img3.png"]
    assert re.search(r"^4 of 5 images on edge01_arm0-3 \+ edge02_arm0-3: [\d.]+ images/s",
                     proc.stdout, re.M)


def test_detect_video_on_an_x86_host_and_an_aarch64_board(tmp_path):
    """A clip made here through a YOLO-shaped detector split over an x86 host and an emulated
    aarch64 board: a line of boxes a frame, each frame's boxes those of onnxruntime on the same
    decoded, letterboxed frame, and an annotated copy of the clip."""
    import av
    import onnx
    from conftest import board_missing
    from graphs import yolo_like
    from test_detector import SIDE, decoded, moving_shapes

    from autodice.backend.session.detect import detect, letterbox

    if board_missing():
        pytest.skip(board_missing())
    onnx.save(yolo_like(side=SIDE), tmp_path / "yolo.onnx")
    moving_shapes(tmp_path / "clip.mp4")
    work = tmp_path / "work"
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "detect_video.py"),
                           str(tmp_path / "clip.mp4"), "--model", str(tmp_path / "yolo.onnx"),
                           "--conf", "0.3", "--work", str(work)],
                          capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^12 frames on edge01_x860-1 \+ edge02_arm0-1: [\d.]+ frames/s",
                     proc.stdout, re.M), proc.stdout
    lines = [json.loads(ln) for ln in (work / "detections.jsonl").read_text().splitlines()]
    ref = ort.InferenceSession(str(tmp_path / "yolo.onnx"))
    frames = decoded(tmp_path / "clip.mp4")
    assert len(lines) == len(frames) == 12
    for line, image in zip(lines, frames):
        x, box = letterbox(image, (1, 3, SIDE, SIDE))
        want = detect(ref.run(None, {"images": x})[0], conf=0.3, box=box)
        assert [d["class"] for d in line["detections"]] == [d.cls for d in want]
        assert np.allclose([d["box"] for d in line["detections"]], [d.box for d in want],
                           atol=0.02)
    with av.open(str(work / "annotated.mp4")) as copy:
        drawn = [f.to_image().size for f in copy.decode(video=0)]
    assert drawn == [(frames[0].width, frames[0].height)] * 12
