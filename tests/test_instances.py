"""A YOLO segmenter's instance masks (YOLOv8-seg's two outputs): decoded by hand on prototypes
drawn here, then ``graphs.yolo_like(masks=32)`` split over two keys and run under mpirun on
pictures, each detection's mask equal to what onnxruntime's outputs give."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from graphs import yolo_like
from PIL import Image

import autodice
from autodice.backend.session.detect import Letterbox, detect, letterbox
from autodice.backend.session.instances import masks_of, write_instances
from autodice.cli import main
from autodice.core.model import load_model

SIDE, CLASSES, MASKS = 64, 8, 32


def head(candidates: list[tuple], m: int = 2) -> np.ndarray:
    """A segmenter's first output, (1, 4 + 2 classes + m, N): each candidate (cx, cy, w, h,
    class, score, coefficients), then candidates of no score (a head has more than rows)."""
    out = np.zeros((1, 4 + 2 + m, 16), np.float32)
    for j, (cx, cy, w, h, cls, score, coefs) in enumerate(candidates):
        out[0, :4, j] = cx, cy, w, h
        out[0, 4 + cls, j] = score
        out[0, 6:, j] = coefs
    return out


def test_each_detection_gets_its_prototypes_mix_cut_to_its_box():
    """Prototype 0 is 1 everywhere, prototype 1 is 1 on the left half of the input: the first
    detection takes prototype 0 (its whole box), the second prototype 1 (the left of its box);
    a third, a suppressed copy of the first, gets nothing."""
    protos = np.zeros((1, 2, 4, 4), np.float32)
    protos[0, 0] = 1.0
    protos[0, 1, :, :2] = 1.0
    out = head([(8, 8, 8, 8, 0, 0.9, (20, 0)), (10, 10, 12, 12, 1, 0.8, (-10, 20)),
                (8, 8, 8, 8, 0, 0.7, (20, 0))])
    first, second = detect(out, conf=0.5, protos=protos, input_hw=(16, 16))
    want = np.zeros((16, 16), bool)
    want[4:12, 4:12] = True  # the box, 4..12 in both directions, less its corners: 2x2
    assert not (first.mask & ~want).any() and (want & ~first.mask).sum() == 4  # prototype
    #                                      cells scaled x4, bilinear, round a square's corners
    assert second.mask[5:16, 4:8].all() and not second.mask[:, 8:].any()
    assert not second.mask[:3].any()  # outside its box (4..16)
    # Through a letterbox: a 32x16 picture in the 16x16 input, scaled by 1/2, 4 rows of grey
    # above: the first box is x 8..24, y 0..16 of the picture.
    box = Letterbox.fit((32, 16), (16, 16))
    assert box == Letterbox(0.5, (0.0, 4.0), (32, 16))
    first, _ = detect(out, conf=0.5, protos=protos, input_hw=(16, 16), box=box)
    assert first.mask.shape == (16, 32) and first.box == (8.0, 0.0, 24.0, 16.0)
    assert first.mask[3:13, 8:24].all() and first.mask[:, 11:21].all()  # corners rounded
    assert not first.mask[:, :8].any() and not first.mask[:, 24:].any()


def test_a_frames_instances_are_numbered_best_first_and_the_best_is_on_top(tmp_path):
    protos = np.ones((1, 2, 4, 4), np.float32)
    out = head([(8, 8, 8, 8, 0, 0.9, (5, 0)), (10, 8, 8, 8, 1, 0.8, (5, 0))])
    found = detect(out, conf=0.5, protos=protos, input_hw=(16, 16))
    png = write_instances(tmp_path, "frame", found, (16, 16))
    image = Image.open(png)
    assert image.mode == "P" and image.size == (16, 16)
    pixels = np.asarray(image)
    assert pixels[8, 5] == 1 and pixels[8, 10] == 1 and pixels[8, 13] == 2 and pixels[0, 0] == 0
    assert not list(tmp_path.glob(".*partial"))


def whole_picture_masks(coefs, protos, boxes, side: int, box) -> np.ndarray:
    """Each mask scaled over the whole picture, as Ultralytics does: what ``masks_of`` must
    give from its boxes alone."""
    _, m, h, w = protos.shape
    soft = 1 / (1 + np.exp(-(coefs @ protos.reshape(m, -1)).reshape(len(coefs), h, w)))
    k = h / side
    x1, y1, x2, y2 = (boxes * k).T[:, :, None, None]
    cols, rows = np.arange(w)[None, None, :], np.arange(h)[None, :, None]
    soft *= (cols >= x1) & (cols < x2) & (rows >= y1) & (rows < y2)
    (w0, h0), (px, py), s = box.size, box.pad, box.scale
    region = (px * k, py * k, (px + w0 * s) * k, (py + h0 * s) * k)
    return np.stack([np.asarray(Image.fromarray(m, "F").resize((w0, h0), Image.BILINEAR,
                                                                box=region)) > 0.5
                     for m in soft])


@pytest.mark.parametrize("side, source", [(64, (96, 64)), (160, (333, 517)), (640, (1280, 720))])
def test_scaling_each_mask_over_its_box_alone_gives_the_whole_pictures_pixels(side, source):
    rng = np.random.default_rng(side)
    centres, sizes = rng.uniform(0, side, (8, 2)), rng.uniform(2, side / 2, (8, 2))
    boxes = np.concatenate([centres - sizes / 2, centres + sizes / 2], 1).astype(np.float32)
    coefs = rng.normal(0, 1, (8, MASKS)).astype(np.float32)
    protos = rng.normal(0, 1, (1, MASKS, side // 4, side // 4)).astype(np.float32)
    box = Letterbox.fit(source, (side, side))
    got = masks_of(coefs, protos, boxes, (side, side), box)
    assert np.array_equal(got, whole_picture_masks(coefs, protos, boxes, side, box))
    assert got.any(axis=(1, 2)).sum() >= 4  # most boxes hold some of their mask


@pytest.fixture(scope="module")
def segmenter(tmp_path_factory):
    """yolo_like with 32 mask coefficients split over two keys: the backbone and neck on one,
    the heads and the prototype masks on the other (cut tensors: the neck's three scales)."""
    d = tmp_path_factory.mktemp("segmenter")
    onnx.save(yolo_like(side=SIDE, classes=CLASSES, masks=MASKS), d / "model.onnx")
    names = load_model(d / "model.onnx").layer_names
    first = names[:names.index("n3") + 1]
    mapping = {"edge01_cpu0": first, "edge02_cpu1": names[len(first):]}
    (d / "mapping.json").write_text(json.dumps(mapping))
    (d / "platform.txt").write_text("edge01, cpu, slots=0\nedge02, cpu, slots=1\n")
    autodice.split(d / "model.onnx", d / "mapping.json", d / "platform.txt", d / "out")
    autodice.gen(d / "out")
    autodice.build(d / "out")
    return d


def pictures(folder, count: int = 4) -> list:
    """Pictures of coloured shapes, of two sizes (letterboxed into the square input apart)."""
    folder.mkdir()
    made = []
    rng = np.random.default_rng(7)
    for k in range(count):
        w, h = (96, 64) if k % 2 else (48, 80)
        img = np.full((h, w, 3), 30, np.uint8)
        for _ in range(3):
            x, y = rng.integers(0, w - 16), rng.integers(0, h - 16)
            img[y:y + 16, x:x + 16] = rng.integers(40, 255, 3)
        Image.fromarray(img).save(folder / f"p{k}.png")
        made.append(folder / f"p{k}.png")
    return made


@pytest.mark.cpp
def test_pictures_through_a_split_segmenter_get_onnxruntimes_instance_masks(segmenter, tmp_path):
    """No --task: the head's shape says detector, the second output prototype masks. Each
    picture's detections.jsonl line, its instance PNG and its annotated picture."""
    made = pictures(tmp_path / "in")
    said = CliRunner().invoke(main, ["run", str(segmenter / "out"), "--input",
                                     str(tmp_path / "in"), "--conf", "0.3",
                                     "--annotate", str(tmp_path / "drawn"),
                                     "--results", str(tmp_path / "r")])
    assert said.exit_code == 0, said.output
    lines = [json.loads(ln) for ln in (tmp_path / "r" / "detections.jsonl").read_text()
             .splitlines()]
    records = json.loads((tmp_path / "r" / "frames.json").read_text())
    ref = ort.InferenceSession(str(segmenter / "model.onnx"))
    partial = 0
    for line, record, path in zip(lines, records, made):
        x, box = letterbox(Image.open(path), (1, 3, SIDE, SIDE))
        out0, out1 = ref.run(None, {"images": x})
        want = detect(out0, conf=0.3, box=box, protos=out1, input_hw=(SIDE, SIDE))
        got = line["detections"]
        assert [d["class"] for d in got] == [d.cls for d in want] and want, path.name
        assert [d["instance"] for d in got] == list(range(1, len(want) + 1))
        pixels = np.asarray(Image.open(tmp_path / "r" / record["mask"]))
        assert pixels.shape == np.asarray(Image.open(path)).shape[:2]
        for k, d in enumerate(want):
            # the PNG keeps the better detection where two overlap: compare where k is on top
            on_top = ~np.any([w.mask for w in want[:k]], axis=0) if k else True
            assert np.mean((pixels == k + 1) != (d.mask & on_top)) <= 0.01, (path.name, k)
            assert got[k]["area"] == pytest.approx(int(d.mask.sum()), abs=0.01 * d.mask.size)
            partial += 0 < d.mask.sum() < d.mask.size
        assert record["mask"] in said.stdout  # its line on stdout names the PNG
    assert partial  # some mask is neither empty nor the whole picture
    assert sorted(p.name for p in (tmp_path / "drawn").iterdir()) == [
        "p0.jpg", "p1.jpg", "p2.jpg", "p3.jpg"]


@pytest.mark.cpp
def test_a_segmenter_session_gives_each_detection_its_mask(segmenter, tmp_path):
    made = pictures(tmp_path / "in", 2)
    with autodice.open(segmenter / "out", task="detect") as s:
        found = list(s.map([Image.open(p) for p in made]))
    for detections, path in zip(found, made):
        size = Image.open(path).size
        assert detections and all(d.mask.shape == (size[1], size[0]) and d.mask.dtype == bool
                                  for d in detections)
