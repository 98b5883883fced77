"""Per-frame results where users look: one line a frame on stdout (never wrapped, never on
stderr), ``--format jsonl`` for programs, and each frame's classes in ``frames.json``; and the
Python API takes what the CLI takes (images, a folder).

A real ``autodice run`` process with stdout and stderr apart: rich's progress on stderr must
neither take the lines nor break them, whatever the width of a label.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autodice.frontend.check import session as ort_session

pytestmark = pytest.mark.cpp


def autodice_run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="80")  # a narrow terminal: nothing may wrap at it
    return subprocess.run([sys.executable, "-m", "autodice", "run", *args], capture_output=True,
                          text=True, timeout=300, env=env)


def best_classes(model: Path, batch: np.ndarray, k: int) -> list[list[int]]:
    whole = ort_session(model)
    name = whole.get_inputs()[0].name
    scores = [whole.run(None, {name: x[None]})[0].reshape(-1) for x in batch]
    return [list(np.argsort(-s, kind="stable")[:k]) for s in scores]


@pytest.fixture(scope="module")
def stream(fig2_built, tmp_path_factory):
    """A batch of 4 frames and labels far wider than a terminal."""
    d = tmp_path_factory.mktemp("results_out")
    batch = np.random.default_rng(3).standard_normal((4, 4, 8, 8)).astype(np.float32)
    np.save(d / "batch.npy", batch)
    scores = ort_session(fig2_built / "model.onnx").get_outputs()[0].shape
    labels = [f"a class with a long name, number {i} " + "x" * 60 for i in range(np.prod(scores))]
    (d / "labels.txt").write_text("\n".join(labels) + "\n")
    return d, batch, labels


def test_each_frames_classes_are_one_line_on_stdout(fig2_built, stream, tmp_path):
    d, batch, labels = stream
    proc = autodice_run(str(fig2_built / "out"), "--input", str(d / "batch.npy"), "--labels",
                        str(d / "labels.txt"), "--top-k", "2", "--results", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    frame_lines = [ln for ln in lines if ln.startswith(("0: ", "1: ", "2: ", "3: "))]
    want = best_classes(fig2_built / "model.onnx", batch, 2)
    assert [ln.split(": ", 1)[0] for ln in frame_lines] == ["0", "1", "2", "3"]
    for line, best in zip(frame_lines, want):  # whole: both classes on the frame's one line
        first, second = (line.find(f"{labels[b]} (") for b in best)
        assert 0 < first < second and len(line) > 160, line
    assert "number" not in proc.stderr  # the results are data: none of them on stderr

    status = json.loads((tmp_path / "r" / "frames.json").read_text())
    assert [[c["label"] for c in s["classes"]] for s in status] == \
        [[labels[i] for i in best] for best in want]


def test_jsonl_gives_programs_one_object_a_frame(fig2_built, stream, tmp_path):
    d, batch, labels = stream
    proc = autodice_run(str(fig2_built / "out"), "--input", str(d / "batch.npy"), "--labels",
                        str(d / "labels.txt"), "--top-k", "1", "--format", "jsonl",
                        "--results", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    want = best_classes(fig2_built / "model.onnx", batch, 1)
    assert [r["frame"] for r in records] == ["0", "1", "2", "3"]
    assert [r["classes"][0]["label"] for r in records] == [labels[b[0]] for b in want]
    assert records == json.loads((tmp_path / "r" / "frames.json").read_text())

    # Without labels a record still says each frame came back (and which failed).
    proc = autodice_run(str(fig2_built / "out"), "--input", str(d / "batch.npy"), "--format",
                        "jsonl", "--results", str(tmp_path / "r2"))
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")] == \
        [{"frame": str(i)} for i in range(4)]


def test_the_api_takes_images_as_the_cli_does(fig2_built, tmp_path):
    """``s.map()`` takes paths and PIL images beside arrays, ``autodice.run(out, "photos/")``
    streams a folder, and classes come from the public ``top_k`` and ``read_labels``."""
    from PIL import Image

    import autodice

    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(9)
    pictures = [Image.fromarray((rng.random((8 + i, 10, 4)) * 255).astype(np.uint8), "RGBA")
                for i in range(3)]
    for i, picture in enumerate(pictures):
        picture.save(photos / f"{i}.png")
    (photos / "3.png").write_bytes(b"not an image")
    recipe = "resize=1,scale=1,mean=0/0/0/0,std=1/1/1/1"
    frames = [autodice.ImageRecipe.parse(recipe).apply(p, (1, 4, 8, 8), np.dtype(np.float32))
              for p in pictures]
    whole = ort_session(fig2_built / "model.onnx")
    want = [whole.run(None, {whole.get_inputs()[0].name: f})[0] for f in frames]

    with autodice.open(fig2_built / "out", preprocess=recipe) as s:
        got = list(s.map([photos / "0.png", str(photos / "1.png"), pictures[2], frames[0],
                          photos / "3.png"]))
        one = s.infer(pictures[1])
    for g, w in zip(got[:3] + [got[3], one], want + [want[0], want[1]]):
        assert np.abs(np.asarray(g).reshape(w.shape) - w).max() <= 1e-5 * np.abs(w).max()
    assert isinstance(got[4], autodice.FrameError) and "cannot make a frame" in str(got[4])

    out = tmp_path / "out"
    shutil.copytree(fig2_built / "out", out, symlinks=True)
    labels = tmp_path / "labels.txt"
    labels.write_text("".join(f"c{i}\n" for i in range(want[0].size)))
    res = autodice.run(out, photos, preprocess=recipe, labels=labels, top=1)
    assert [e.index for e in res.errors] == [3] and res.stats["frames"] == 3  # results
    names = autodice.read_labels(labels)
    status = json.loads((out / "results" / "frames.json").read_text())
    assert [[c["label"] for c in s["classes"]] for s in status[:3]] == [
        [n for n, _ in autodice.top_k(w, names, 1)] for w in want]
    assert "classes" not in status[3] and "cannot make a frame" in status[3]["error"]
