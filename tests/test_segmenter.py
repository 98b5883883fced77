"""A segmenter through the whole chain without torch, and its masks: ``run --task segment``.

``graphs.lraspp_like`` (LRASPP's head: a low-level tap, a gated high branch, both classified
and added, upsampled to the input) is split over two keys with a cut between the branches,
gen'd, built and run under mpirun; pictures of three shapes go through it with ``--task
segment``, and each mask, in the picture's own pixels, must be the per-pixel argmax of
onnxruntime's scores on the same letterboxed frame, mapped back the same way.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from graphs import lraspp_like
from PIL import Image, ImageDraw

import autodice
from autodice.backend.session.detect import Letterbox, letterbox
from autodice.backend.session.frames import ImageRecipe
from autodice.backend.session.palette import PALETTE
from autodice.backend.session.results import Reading
from autodice.backend.session.segment import Mask, Segment, classes_of, to_source
from autodice.cli import main
from autodice.core.errors import AutodiceError
from autodice.core.model import load_model
from autodice.core.plan import load_plan

SIDE, CLASSES = 64, 4
SHAPES = {"wide.png": (96, 48), "tall.jpg": (40, 90), "square.png": (64, 64)}


@pytest.fixture(scope="module")
def segmenter(tmp_path_factory):
    """lraspp_like over two keys: the backbone's low part on one, the high branch, its gate
    and both classifiers on the other (the low tap and the backbone both cross)."""
    d = tmp_path_factory.mktemp("segmenter")
    onnx.save(lraspp_like(side=SIDE, classes=CLASSES), d / "model.onnx")
    names = load_model(d / "model.onnx").layer_names
    cut = names.index("s2.conv")
    (d / "mapping.json").write_text(json.dumps({"edge01_cpu0": names[:cut],
                                                "edge02_cpu1": names[cut:]}))
    (d / "platform.txt").write_text("edge01, cpu, slots=0\nedge02, cpu, slots=1\n")
    autodice.split(d / "model.onnx", d / "mapping.json", d / "platform.txt", d / "out")
    autodice.gen(d / "out")
    autodice.build(d / "out")
    return d


def pictures(folder) -> dict:
    """A picture of each shape: two discs and a bar on a gradient."""
    folder.mkdir(exist_ok=True)
    made = {}
    for i, (name, (w, h)) in enumerate(SHAPES.items()):
        ramp = np.linspace(0, 255, w, dtype=np.float32)[None, :, None].repeat(h, 0)
        image = Image.fromarray(np.concatenate([ramp, ramp[::-1], ramp * 0 + 40 * i], 2)
                                .astype(np.uint8))
        pen = ImageDraw.Draw(image)
        pen.ellipse((w // 5, h // 5, w // 2, h // 2), fill=(250, 30, 30))
        pen.rectangle((w // 2, h * 2 // 3, w - 2, h - 2), fill=(20, 20, 240))
        image.save(folder / name)
        made[name] = folder / name
    return made


def reference(model, picture) -> tuple[np.ndarray, np.ndarray]:
    """(onnxruntime's scores on the letterboxed frame, their per-pixel argmax in the picture's
    pixels): what --task segment must write."""
    frame, box = letterbox(picture, (1, 3, SIDE, SIDE), np.float32, ImageRecipe())
    scores = ort.InferenceSession(str(model)).run(None, {"image": frame})[0]
    return scores, to_source(scores[0].argmax(0).astype(np.uint8), box, (SIDE, SIDE))


def assert_same_classes(got: np.ndarray, scores: np.ndarray, want: np.ndarray) -> None:
    """Equal, but where onnxruntime's two best scores are within 1e-3 of each other (ncnn's
    float order may tip such a tie): at most 1 % of the pixels, and only those."""
    differ = got != want
    top2 = np.sort(scores[0], axis=0)[-2:]
    ties = (top2[1] - top2[0]) < 1e-3
    assert differ.mean() <= 0.01
    if differ.any():  # a differing pixel of the source maps to a near-tie of the input
        assert ties.mean() > 0, "pixels differ where no scores were tied"


@pytest.mark.cpp
def test_pictures_through_the_segmenter_give_onnxruntimes_masks(segmenter, tmp_path):
    made = pictures(tmp_path / "pics")
    (tmp_path / "labels.txt").write_text("background\nred\nblue\nsky\n")
    r = CliRunner().invoke(main, ["run", str(segmenter / "out"), "--input",
                                  str(tmp_path / "pics"), "--task", "segment", "--labels",
                                  str(tmp_path / "labels.txt"), "--annotate",
                                  str(tmp_path / "drawn")])
    assert r.exit_code == 0, r.output
    results = segmenter / "out" / "results"
    records = {rec["frame"]: rec for rec in json.loads((results / "frames.json").read_text())}
    for name, path in made.items():
        stem = path.stem
        mask_file = results / "masks" / f"{stem}.png"
        assert records[name]["mask"] == f"masks/{stem}.png"
        png = Image.open(mask_file)
        assert png.mode == "P" and png.size == SHAPES[name]
        assert png.getpalette()[:12] == PALETTE[:12]
        scores, want = reference(segmenter / "model.onnx", path)
        got = np.asarray(png)
        assert_same_classes(got, scores, want)
        shares = records[name]["shares"]
        assert abs(sum(c["share"] for c in shares) - 1) < 1e-4
        assert [c["share"] for c in shares] == sorted((c["share"] for c in shares),
                                                       reverse=True)
        labels = ["background", "red", "blue", "sky"]
        assert all(c["label"] == labels[c["class"]] for c in shares)
        # The line on stdout names the classes and the mask.
        assert f"{name}: " in r.stdout and f"-> masks/{stem}.png" in r.stdout
        drawn = Image.open(tmp_path / "drawn" / f"{stem}.jpg")
        assert drawn.size == SHAPES[name]
    assert "masks into" in r.stderr


@pytest.mark.cpp
def test_a_segmenter_session_gives_each_picture_its_mask(segmenter, tmp_path):
    made = pictures(tmp_path / "pics")
    with autodice.open(segmenter / "out", task="segment") as s:
        results = list(s.map([made["wide.png"], Image.open(made["tall.jpg"])]))
        frame = np.zeros((1, 3, SIDE, SIDE), np.float32)
        as_array = s.infer(frame)  # an array: its mask stays in the input's pixels
    for result, name in zip(results, ("wide.png", "tall.jpg")):
        assert isinstance(result, Mask) and result.classes.shape == SHAPES[name][::-1]
        scores, want = reference(segmenter / "model.onnx", made[name])
        assert_same_classes(result.classes, scores, want)
    assert as_array.classes.shape == (SIDE, SIDE)


def test_the_mask_maps_back_through_the_letterbox():
    """A 100x50 picture letterboxed into 64x64 sits in rows 16..47: the mask's rows there, and
    only those, come back, scaled to the picture; a half-size output maps the same."""
    box = Letterbox.fit((100, 50), (64, 64))
    assert box.pad == (0.0, 16.0)
    classes = np.zeros((64, 64), np.uint8)
    classes[16:48, 32:] = 2  # the picture's right half
    classes[:16] = classes[48:] = 3  # the grey bands: never in the picture
    back = to_source(classes, box, (64, 64))
    assert back.shape == (50, 100) and set(np.unique(back)) == {0, 2}
    assert (back[:, 50:] == 2).all() and (back[:, :50] == 0).all()
    half = to_source(classes[::2, ::2].copy(), box, (64, 64))
    assert (half == back).all()


def test_the_classes_of_an_output_and_their_shares():
    assert classes_of((1, 21, 520, 520)) == 21 and classes_of((1, 64, 64)) is None
    for bad in ((1, 300, 8, 8), (1, 1000), (2, 3, 8, 8), (1, 3, 1, 8)):
        with pytest.raises(AutodiceError, match="--task segment: the output"):
            classes_of(bad)
    one = Segment((4, 4)).read(np.array([[[[1, -1], [-2, 3]]]], np.float32), None)
    assert one.classes.tolist() == [[1, 0], [0, 1]]  # one class: its logit above 0
    mask = Mask(np.array([[0, 0, 0, 2], [2, 2, 0, 5]], np.uint8))
    assert mask.shares() == [(0, 0.5), (2, 0.375), (5, 0.125)]
    assert mask.as_json(["bg", "a", "b"]) == [{"class": 0, "share": 0.5, "label": "bg"},
                                              {"class": 2, "share": 0.375, "label": "b"},
                                              {"class": 5, "share": 0.125}]


def test_segment_refuses_what_it_cannot_read_in_one_line(segmenter, fig2_built, tmp_path):
    (tmp_path / "three.txt").write_text("a\nb\nc\n")
    for args, said in (
            ([str(segmenter / "out"), "--input", str(tmp_path), "--task", "segment",
              "--labels", str(tmp_path / "three.txt")], "3 labels, but the segmenter's output "
                                                         '"out" has 4 classes'),
            ([str(fig2_built / "out"), "--input", str(tmp_path), "--task", "segment"],
             "--task segment: frames are letterboxed into a 1x3xHxW input; this one is 1x4x8x8"),
            ([str(segmenter / "out"), "--input", str(tmp_path), "--task", "detect",
              "--preprocess", "resize=1"], "--task detect: frames are letterboxed as "
                                           "Ultralytics does it, not by --preprocess"),
            ([str(segmenter / "out"), "--input", str(tmp_path), "--annotate",
              str(tmp_path / "a")], "--annotate: only with --task detect or segment")):
        r = CliRunner().invoke(main, ["run", *args])
        assert r.exit_code == 2 and r.output.startswith("error: ") and said in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1


def test_a_reading_of_segment_normalises_by_the_recipe(segmenter):
    reading = Reading.of(load_plan(segmenter / "out"), "segment",
                         preprocess="mean=0.5,std=0.25")
    assert reading.task == Segment((SIDE, SIDE), ImageRecipe(mean=(0.5,), std=(0.25,)))
