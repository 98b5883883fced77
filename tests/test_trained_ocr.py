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


def drawn_page(rng: np.random.Generator) -> Image.Image:
    """2-5 words at random places, sizes and colours on a plain background."""
    img = Image.new("RGB", (320, 320), tuple(int(v) for v in rng.integers(170, 250, 3)))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(2, 6))):
        draw.text((int(rng.integers(4, 120)), int(rng.integers(4, 280))),
                  WORDS[int(rng.integers(len(WORDS)))],
                  fill=tuple(int(v) for v in rng.integers(0, 90, 3)),
                  font=font(int(rng.integers(18, 40))))
    return img


VOCABULARY = ("edge board frame camera stream model layer tensor video pixel image split cluster "
              "rank thread core memory power search mapping detect segment label score cloud "
              "north river green light stone paper water table house garden market window orange "
              "silver yellow purple winter summer autumn spring Monday Friday").split()


def drawn_line(rng: np.random.Generator) -> tuple[str, Image.Image]:
    """A word (and, every other time, a number) drawn on a 320x48 crop, and what it says."""
    text = VOCABULARY[int(rng.integers(len(VOCABULARY)))]
    if rng.random() < 0.5:
        text += f" {int(rng.integers(10, 999))}"
    img = Image.new("RGB", (320, 48), tuple(int(v) for v in rng.integers(190, 250, 3)))
    ImageDraw.Draw(img).text((int(rng.integers(2, 30)), 8), text,
                             fill=tuple(int(v) for v in rng.integers(0, 70, 3)),
                             font=font(int(rng.integers(24, 32))))
    return text, img


def as_frame(img: Image.Image, mean, std) -> np.ndarray:
    x = (np.asarray(img, np.float32) / 255 - mean) / std
    return x.transpose(2, 0, 1)[None].astype(np.float32)


def split_and_build(work: Path, name: str, shape: str, frame: np.ndarray, **gen) -> Path:
    """The model split over two keys by FLOPs, converted and checked on ``frame`` (``gen``:
    more of autodice.gen's options), built."""
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
    autodice.gen(work / "out", verify_with=work / "frame.npy", **gen)
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
def test_the_text_detector_in_int8(tmp_path):
    """Both keys int8, calibrated on 32 drawn pages (the first layer and those that alone move
    their key's output most kept fp32: gen's default): on 50 other pages, the binarized map
    covers what fp32's does with a mean IoU of at least 0.95."""
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    rng = np.random.default_rng(1)
    np.save(tmp_path / "calibration.npy",
            np.concatenate([as_frame(drawn_page(rng), mean, std) for _ in range(32)]))
    frames = [as_frame(drawn_page(rng), mean, std) for _ in range(50)]
    name = "ch_PP-OCRv4_det_infer.onnx"
    out = split_and_build(tmp_path / "det", name, "1x3x320x320", frames[0], precision="int8",
                          calibration=tmp_path / "calibration.npy")
    params = [p.read_text() for p in sorted((out / "ncnn").glob("*.param"))]
    assert all(" 8=" in p for p in params)  # both keys have int8 layers
    ious = []
    for got, want in zip(stream(out, frames), whole(name, frames)):
        got, want = got.reshape(want.shape) > 0.3, want > 0.3
        assert 0.01 < want.mean() < 0.5
        ious.append((got & want).sum() / (got | want).sum())
    assert np.mean(ious) >= 0.95 and min(ious) >= 0.85, (np.mean(ious), min(ious))
    np.save(tmp_path / "pages.npy", np.concatenate(frames[:8]))
    from click.testing import CliRunner

    from autodice.cli import main

    r = CliRunner().invoke(main, ["check", str(out), "--frames", str(tmp_path / "pages.npy")])
    assert r.exit_code == 0, r.output  # check's own figure, on 8 of the pages, agrees
    said = [ln for ln in r.output.splitlines() if ln.startswith('output "sigmoid_0.tmp_0" (map)')]
    assert len(said) == 1 and float(said[0].split("IoU mean ")[1].split(",")[0]) >= 0.95, said
    assert r.output.splitlines()[-1].startswith("loses the most: key edge01_cpu")


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
def test_the_recognizer_in_int8(tmp_path):
    """Both keys int8 (gen's default layers kept fp32), calibrated on 32 drawn crops: on 100
    others, the same decoded string as fp32's on at least 95 (fp32 itself reads at least 90 of
    them right: the crops are legible, not noise on which any two nets disagree)."""
    rng = np.random.default_rng(2)
    np.save(tmp_path / "calibration.npy",
            np.concatenate([as_frame(drawn_line(rng)[1], 0.5, 0.5) for _ in range(32)]))
    crops = [drawn_line(rng) for _ in range(100)]
    frames = [as_frame(img, 0.5, 0.5) for _, img in crops]
    name = "ch_PP-OCRv4_rec_infer.onnx"
    out = split_and_build(tmp_path / "rec", name, "1x3x48x320", frames[0], precision="int8",
                          calibration=tmp_path / "calibration.npy")
    table = characters(MODELS / name)
    got = ["".join(table[c] for c in ctc(y)).strip() for y in stream(out, frames)]
    want = ["".join(table[c] for c in ctc(y)).strip() for y in whole(name, frames)]
    assert sum(w == text for w, (text, _) in zip(want, crops)) >= 90
    assert sum(g == w for g, w in zip(got, want)) >= 95, list(zip(got, want))


@needs_models
def test_will_it_run_on_noise_and_on_a_page(tmp_path):
    """``layers --check`` on the detector: on noise its map is near 0 (the tail of its last
    Sigmoid, where onnxruntime's own Sigmoid is off by 0.2 % of that scale and ncnn's is not),
    and every layer runs, held to the function there. On a drawn page every layer runs too;
    asked again, the answer is the cached one."""
    from click.testing import CliRunner

    from autodice.cli import main

    model = MODELS / "ch_PP-OCRv4_det_infer.onnx"
    np.save(tmp_path / "page.npy", as_frame(page(0), [0.485, 0.456, 0.406],
                                            [0.229, 0.224, 0.225]))
    ask = ["layers", str(model), "--input-shape", "x=1x3x320x320", "--check"]
    r = CliRunner().invoke(main, ask)
    assert r.exit_code == 0 and "every layer runs in ncnn (330 layers)" in r.output, r.output
    for k in range(2):  # the second time (at least) from the cache
        r = CliRunner().invoke(main, [*ask, "--verify-with", str(tmp_path / "page.npy")])
        assert r.exit_code == 0 and "every layer runs in ncnn (330 layers)" in r.output
        assert "on your frame" in r.output and (k == 0 or r.output.rstrip().endswith(
            "(cached)")), r.output
