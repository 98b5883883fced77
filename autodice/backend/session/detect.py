"""Boxes from a detector's output, in the source image's pixels: ``run --task detect``.

A YOLO head's output is no answer a person can use. This turns it into one, on the head, beside
the session, for the two layouts Ultralytics exports:

- ``(1, 4 + classes, N)`` (YOLOv8, YOLO11): each of the N candidates is a box (centre x and y,
  width, height, in the model input's pixels) and one score per class; the best class is the
  candidate's, candidates under ``conf`` go, and class-aware non-maximum suppression keeps the
  best of each cluster of boxes that overlap past ``iou``;
- ``(1, K, 6)`` (YOLO26's end-to-end head): each row is a box (corners), a score and a class,
  already suppressed in the graph: only ``conf`` and ``max_det`` apply.

A YOLO segmenter's first output is the first layout with mask coefficients after the scores,
and its second the prototype masks: each detection then gets its own mask
(:mod:`.instances`).

Frames are made from images by Ultralytics' letterbox (:func:`letterbox`: the image scaled to
fit, centred on grey 114, RGB in [0, 1], no mean or std), and :class:`Letterbox` maps each box
back through it to the source's pixels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...core.errors import AutodiceError

CONF, IOU, MAX_DET = 0.25, 0.7, 300  # Ultralytics' defaults for predict
_CLASS_OFFSET = 7680.0  # boxes of different classes moved this far apart: NMS never pairs them
PAD = 114  # the letterbox's grey


@dataclass(frozen=True)
class Letterbox:
    """How a source image became the model's input: scaled by ``scale``, then shifted by
    ``pad`` (left, top) input pixels; ``size`` is the source's (width, height)."""

    scale: float
    pad: tuple[float, float]
    size: tuple[int, int]

    @staticmethod
    def fit(size: tuple[int, int], shape: tuple[int, int]) -> Letterbox:
        """The letterbox of a ``size`` (width, height) image into an input of ``shape``
        (height, width), as Ultralytics computes it."""
        (w0, h0), (h, w) = size, shape
        scale = min(h / h0, w / w0)
        new_w, new_h = round(w0 * scale), round(h0 * scale)
        # Ultralytics' rounding of the padding: the image sits at whole pixels
        return Letterbox(scale, (float(round((w - new_w) / 2 - 0.1)),
                                 float(round((h - new_h) / 2 - 0.1))), (w0, h0))

    def to_source(self, boxes: np.ndarray) -> np.ndarray:
        """``boxes`` (x1, y1, x2, y2 in input pixels) in the source's pixels, inside it."""
        px, py = self.pad
        out = (boxes - np.array([px, py, px, py], np.float32)) / self.scale
        out[:, 0::2] = out[:, 0::2].clip(0, self.size[0])
        out[:, 1::2] = out[:, 1::2].clip(0, self.size[1])
        return out


def letterbox(image, shape: tuple[int, ...], dtype=np.float32,
              recipe=None) -> tuple[np.ndarray, Letterbox]:
    """``image`` (a path, a PIL image or a decoded video frame) as a frame of ``shape``
    (1, 3, H, W) by Ultralytics' recipe, and the letterbox to map boxes back. ``recipe``: an
    :class:`~.frames.ImageRecipe` whose scale, channel order, mean and std the letterboxed
    picture is normalised by instead (a segmenter's), its resize aside.

    A video frame (PyAV's) is scaled by FFmpeg as it is made RGB (:func:`~.video.scaled`;
    bench/detect_bench.py times both ways)."""
    from PIL import Image

    if len(shape) != 4 or shape[:2] != (1, 3):
        raise ValueError(f"the input is {'x'.join(map(str, shape))}, not one RGB image (1x3xHxW)")
    from .video import is_frame, scaled

    h, w = shape[2], shape[3]
    if is_frame(image):
        box = Letterbox.fit((image.width, image.height), (h, w))
        new = (round(image.width * box.scale), round(image.height * box.scale))
        rgb = scaled(image, *new)
    else:
        img = image if isinstance(image, Image.Image) else Image.open(image)
        box = Letterbox.fit(img.size, (h, w))
        new = (round(img.size[0] * box.scale), round(img.size[1] * box.scale))
        rgb = np.asarray(img.convert("RGB").resize(new, Image.BILINEAR))
    x, y = int(box.pad[0]), int(box.pad[1])
    if recipe is not None:
        canvas = np.full((h, w, 3), PAD, np.uint8)
        canvas[y:y + new[1], x:x + new[0]] = rgb
        return recipe.normalised(canvas.astype(np.float32), dtype), box
    # In one pass into the padded frame: float64 steps between took 4x as long.
    frame = np.full((1, 3, h, w), np.float32(PAD) / np.float32(255), dtype)
    np.divide(rgb.transpose(2, 0, 1), np.float32(255), out=frame[0, :, y:y + new[1],
                                                                  x:x + new[0]],
              casting="unsafe")
    return frame, box


@dataclass(frozen=True)
class Detection:
    box: tuple[float, float, float, float]  # x1, y1, x2, y2
    score: float
    cls: int
    # a segmenter's: the detection's pixels (bool, the source's height x width), else None
    mask: np.ndarray | None = field(default=None, compare=False, repr=False)

    def as_json(self, labels: list[str] | None = None) -> dict:
        """As ``detections.jsonl`` holds it (``label`` when class names are given)."""
        out = {"box": [round(v, 2) for v in self.box], "score": round(self.score, 5),
               "class": self.cls}
        if labels is not None and 0 <= self.cls < len(labels):
            out["label"] = labels[self.cls]
        return out


@dataclass(frozen=True)
class Detect:
    """``--task detect``'s settings: a candidate's score must pass ``conf``; boxes of one class
    overlapping past ``iou`` are one; at most ``max_det`` a frame."""

    conf: float = CONF
    iou: float = IOU
    max_det: int = MAX_DET
    protos: str | None = None  # a segmenter's prototype masks (its output's name)
    input_hw: tuple[int, int] | None = None  # the input's, which the prototypes cover

    def check(self) -> None:
        """Raises AutodiceError naming each setting out of its range, before any frame."""
        bad = [f"--{name} {value:g}: from 0 to 1" for name, value in (("conf", self.conf),
                                                                      ("iou", self.iou))
               if not 0 <= value <= 1]
        if self.max_det < 1:
            bad.append(f"--max-det {self.max_det}: at least 1")
        if bad:
            raise AutodiceError(*bad)

    recipe = None  # pictures are letterboxed as Ultralytics does: RGB / 255, no mean or std

    def read(self, output: np.ndarray, box: Letterbox | None,
             protos: np.ndarray | None = None) -> list[Detection]:
        """One frame's boxes, by its first output (and their masks, by a segmenter's prototype
        masks: see :func:`detect`)."""
        return detect(output, self.conf, self.iou, self.max_det, box, protos, self.input_hw)


def layout(shape: tuple[int, ...]) -> str:
    """``"yolo"`` for (1, 4 + classes, N), ``"end2end"`` for (1, K, 6).

    Raises:
        AutodiceError: an output that is neither, named by its shape.
    """
    if len(shape) == 3 and shape[0] == 1 and shape[2] == 6 and shape[1] != 6:
        return "end2end"
    if len(shape) == 3 and shape[0] == 1 and shape[1] > 4 and shape[2] > shape[1]:
        return "yolo"
    raise AutodiceError(f"--task detect: the output is {'x'.join(map(str, shape))}, neither "
                        "a YOLO head's 1x(4+classes)xN nor an end-to-end head's 1xKx6")


def nms(boxes: np.ndarray, scores: np.ndarray, iou: float,
        most: int | None = None) -> np.ndarray:
    """Indices of the boxes (x1, y1, x2, y2) greedy non-maximum suppression keeps, best first:
    each kept box removes the lower-scored ones that overlap it by more than ``iou``. With
    ``most``, the first ``most`` of them (the same boxes, found in at most ``most`` steps:
    8,400 candidates that all pass ``conf`` took 1.9 s to suppress in full, and 300 are kept)."""
    order = np.argsort(-scores, kind="stable")
    area = (boxes[:, 2] - boxes[:, 0]).clip(0) * (boxes[:, 3] - boxes[:, 1]).clip(0)
    keep = []
    while order.size and (most is None or len(keep) < most):
        i, rest = order[0], order[1:]
        keep.append(i)
        lt = np.maximum(boxes[i, :2], boxes[rest, :2])
        rb = np.minimum(boxes[i, 2:], boxes[rest, 2:])
        inter = (rb - lt).clip(0).prod(axis=1)
        union = area[i] + area[rest] - inter
        order = rest[inter <= iou * np.maximum(union, 1e-12)]
    return np.array(keep, dtype=np.int64)


def detect(output: np.ndarray, conf: float = CONF, iou: float = IOU, max_det: int = MAX_DET,
           box: Letterbox | None = None, protos: np.ndarray | None = None,
           input_hw: tuple[int, int] | None = None) -> list[Detection]:
    """One frame's detections, best first, at most ``max_det``; boxes in the source's pixels
    when ``box`` says how the frame was made, else in the input's. With a segmenter's
    ``protos`` (``1xMxhxw`` over an input of ``input_hw``), the first output's last M rows are
    mask coefficients, and each detection gets its mask."""
    out = np.asarray(output, dtype=np.float32)
    coefs = None
    if layout(out.shape) == "end2end":
        rows = out[0][out[0, :, 4] > conf]
        rows = rows[np.argsort(-rows[:, 4], kind="stable")][:max_det]
        boxes, scores, classes = rows[:, :4], rows[:, 4], rows[:, 5].astype(np.int64)
    else:
        pred = out[0]
        end = len(pred) - (protos.shape[1] if protos is not None else 0)
        best = pred[4:end].max(axis=0)  # one pass (an argmax over every column: 9 times longer)
        kept = best > conf
        scores, classes = best[kept], pred[4:end, kept].argmax(axis=0)
        xywh = pred[:4, kept].T
        boxes = np.concatenate([xywh[:, :2] - xywh[:, 2:] / 2, xywh[:, :2] + xywh[:, 2:] / 2],
                               axis=1)
        chosen = nms(boxes + (classes * _CLASS_OFFSET)[:, None], scores, iou, max_det)
        boxes, scores, classes = boxes[chosen], scores[chosen], classes[chosen]
        if protos is not None:
            coefs = pred[end:, kept][:, chosen].T
    masks = [None] * len(boxes)
    if coefs is not None:
        from .instances import masks_of

        hw = input_hw or (4 * protos.shape[2], 4 * protos.shape[3])  # Ultralytics': 1/4 scale
        masks = list(masks_of(coefs, np.asarray(protos, np.float32), boxes, hw, box))
    if box is not None:
        boxes = box.to_source(boxes)
    return [Detection(tuple(float(v) for v in b), float(s), int(c), m)
            for b, s, c, m in zip(boxes, scores, classes, masks)]
