"""Trained models from a package that ships them: PP-OCR's text detector, its text-direction
classifier and its recognizer, from the ``rapidocr-onnxruntime`` wheel (``make test`` installs it
without its dependencies: only its .onnx files are read).

They are Paddle exports, as users bring them: dims of -1, inputs of any size fixed with
``--input-shape``. Each is split over two keys, converted (and each conversion checked), built
and streamed on text the test draws with Pillow. What a user reads from each is the same as
onnxruntime's on the whole model: the detector's binarized map, the classifier's class, the
recognizer's decoded string.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

import autodice
from autodice.core.model import load_model
from autodice.frontend.check import session as ort_session
from autodice.frontend.suggest import balanced_mapping

pytestmark = pytest.mark.cpp
SPEC = importlib.util.find_spec("rapidocr_onnxruntime")
MODELS = Path(SPEC.submodule_search_locations[0]) / "models" if SPEC else None
needs_models = pytest.mark.skipif(MODELS is None, reason="rapidocr-onnxruntime is not installed "
                                  "(make test installs it)")
WORDS = ["autodice", "EDGE 2026", "frames/s", "Jetson", "pipeline", "hello world"]


def font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.truetype("DejaVuSans.ttf", size)
    except OSError:
        return ImageFont.load_default(size)


def line(text: str, width: int, height: int = 48) -> Image.Image:
    img = Image.new("RGB", (width, height), (236, 232, 224))
    ImageDraw.Draw(img).text((6, 8), text, fill=(25, 25, 35), font=font(28))
    return img


def page(k: int) -> Image.Image:
    img = Image.new("RGB", (320, 320), (230 - 9 * k, 228, 220))
    draw = ImageDraw.Draw(img)
    for j in range(4):
        draw.text((14 + 5 * k, 18 + 74 * j), WORDS[(j + k) % len(WORDS)], fill=(20, 20, 30),
                  font=font(30))
    return img


def as_frame(img: Image.Image, mean, std) -> np.ndarray:
    x = (np.asarray(img, np.float32) / 255 - mean) / std
    return x.transpose(2, 0, 1)[None].astype(np.float32)


def split_and_build(work: Path, name: str, shape: str, frame: np.ndarray) -> Path:
    """The model split over two keys by FLOPs, converted and checked on ``frame``, built."""
    work.mkdir()
    model = work / "model.onnx"
    model.write_bytes((MODELS / name).read_bytes())
    (work / "platform.txt").write_text("edge01, cpu, slots=0-1\n")
    dims = tuple(int(d) for d in shape.split("x"))
    mapping = balanced_mapping(load_model(model, {"x": dims}), ["edge01_cpu0", "edge01_cpu1"])
    (work / "mapping.json").write_text(json.dumps(mapping))
    autodice.split(model, work / "mapping.json", work / "platform.txt", work / "out",
                   input_shapes={"x": dims})
    np.save(work / "frame.npy", frame)
    autodice.gen(work / "out", verify_with=work / "frame.npy")
    autodice.build(work / "out")
    return work / "out"


def stream(out: Path, frames: list[np.ndarray]) -> list[np.ndarray]:
    with autodice.open(out) as s:
        return [np.asarray(y) for y in s.map(frames)]


def whole(name: str, frames: list[np.ndarray]) -> list[np.ndarray]:
    model = ort_session(MODELS / name)
    return [model.run(None, {"x": f})[0] for f in frames]


@needs_models
def test_the_text_detectors_binarized_map(tmp_path):
    frames = [as_frame(page(k), [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]) for k in range(4)]
    name = "ch_PP-OCRv4_det_infer.onnx"
    out = split_and_build(tmp_path / "det", name, "1x3x320x320", frames[0])
    for got, want in zip(stream(out, frames), whole(name, frames)):
        got, want = got.reshape(want.shape) > 0.3, want > 0.3
        assert 0.02 < want.mean() < 0.5  # it found the text drawn, not everything
        assert (got & want).sum() / (got | want).sum() >= 0.999


@needs_models
def test_the_direction_classifiers_class(tmp_path):
    upright = [line(w, 192) for w in WORDS]
    images = upright + [im.rotate(180) for im in upright]
    frames = [as_frame(im, 0.5, 0.5) for im in images]
    name = "ch_ppocr_mobile_v2.0_cls_infer.onnx"
    out = split_and_build(tmp_path / "cls", name, "1x3x48x192", frames[0])
    got = [int(y.reshape(-1).argmax()) for y in stream(out, frames)]
    want = [int(y.reshape(-1).argmax()) for y in whole(name, frames)]
    assert got == want
    assert sum(c == 0 for c in want[:len(WORDS)]) + sum(c == 1 for c in want[len(WORDS):]) \
        >= len(images) - 2  # trained: upright text is class 0, turned text class 1


def ctc(scores: np.ndarray) -> list[int]:
    """Greedy CTC: the argmax per step, repeats merged, blanks (0) dropped."""
    best = scores.reshape(scores.shape[-2], -1).argmax(-1)
    return [int(c) for k, c in enumerate(best) if c != 0 and (k == 0 or c != best[k - 1])]


def characters(model: Path) -> list[str]:
    """The recognizer's classes as PaddleOCR decodes them: blank, the model's own character
    list (its metadata), then a space."""
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(model), load_external_data=False).metadata_props}
    return ["", *meta["character"].splitlines(), " "]


@needs_models
def test_the_recognizers_string(tmp_path):
    frames = [as_frame(line(w, 320), 0.5, 0.5) for w in WORDS]
    name = "ch_PP-OCRv4_rec_infer.onnx"
    out = split_and_build(tmp_path / "rec", name, "1x3x48x320", frames[0])
    table = characters(MODELS / name)
    got = ["".join(table[c] for c in ctc(y)).strip() for y in stream(out, frames)]
    want = ["".join(table[c] for c in ctc(y)).strip() for y in whole(name, frames)]
    assert got == want == WORDS  # split over two keys in ncnn, it reads what was drawn


@needs_models
def test_will_it_run_names_the_first_layer_that_fails_alone(tmp_path):
    """``layers --check`` on the detector: on noise its map is near 0, where ncnn's Sigmoid is
    off by 0.2 % of that scale (1e-7 absolute): the check cuts its 330 layers down to that one.
    On a drawn page every layer runs; asked again, the answer is the cached one."""
    from click.testing import CliRunner

    from autodice.cli import main

    model = MODELS / "ch_PP-OCRv4_det_infer.onnx"
    np.save(tmp_path / "page.npy", as_frame(page(0), [0.485, 0.456, 0.406],
                                            [0.229, 0.224, 0.225]))
    ask = ["layers", str(model), "--input-shape", "x=1x3x320x320", "--check"]
    r = CliRunner().invoke(main, ask)
    assert r.exit_code == 1, r.output
    assert 'the first layer that fails is "p2o.Sigmoid.0"' in r.output
    assert "--verify-with FRAME" in r.output  # how to check on a real frame
    for k in range(2):  # the second time (at least) from the cache
        r = CliRunner().invoke(main, [*ask, "--verify-with", str(tmp_path / "page.npy")])
        assert r.exit_code == 0 and "every layer runs in ncnn (330 layers)" in r.output
        assert "on your frame" in r.output and (k == 0 or r.output.rstrip().endswith(
            "(cached)")), r.output
