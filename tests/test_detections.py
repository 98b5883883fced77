"""Boxes from a detector's output (autodice/backend/session/detect.py): Ultralytics' two layouts,
class-aware NMS against a plain reference, and the letterbox there and back."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from autodice.backend.session.detect import Letterbox, detect, layout, letterbox, nms
from autodice.core.errors import AutodiceError


def iou(a, b) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
    return w * h / union


def reference_nms(boxes, scores, threshold) -> list[int]:
    """Greedy NMS as the papers state it, one pair at a time."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    kept = []
    for i in order:
        if all(iou(boxes[i], boxes[k]) <= threshold for k in kept):
            kept.append(i)
    return kept


@pytest.mark.parametrize("seed", range(20))
def test_nms_keeps_what_the_plain_greedy_rule_keeps(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 200))
    xy = rng.uniform(0, 100, (n, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(1, 40, (n, 2))], axis=1).astype(np.float32)
    scores = rng.permutation(n).astype(np.float32) / n  # distinct: one right order
    threshold = float(rng.uniform(0.2, 0.8))
    assert nms(boxes, scores, threshold).tolist() == reference_nms(boxes.tolist(),
                                                                   scores.tolist(), threshold)


def yolo_output(candidates, classes=3, n=16) -> np.ndarray:
    """(1, 4 + classes, n): the given (cx, cy, w, h, class, score) candidates, the rest empty."""
    out = np.zeros((1, 4 + classes, n), np.float32)
    for j, (cx, cy, w, h, c, s) in enumerate(candidates):
        out[0, :4, j] = (cx, cy, w, h)
        out[0, 4 + c, j] = s
    return out


def test_a_yolo_head_gives_boxes_suppressed_per_class():
    out = yolo_output([(50, 50, 20, 20, 0, 0.9),   # kept
                       (52, 50, 20, 20, 0, 0.8),   # the same object, same class: suppressed
                       (52, 50, 20, 20, 1, 0.7),   # the same place, another class: kept
                       (10, 10, 4, 4, 2, 0.2)])    # under conf
    found = detect(out, conf=0.25, iou=0.7)
    assert [(d.cls, round(d.score, 2)) for d in found] == [(0, 0.9), (1, 0.7)]
    assert found[0].box == (40.0, 40.0, 60.0, 60.0)
    assert found[0].as_json(["person", "car", "dog"]) == {
        "box": [40.0, 40.0, 60.0, 60.0], "score": 0.9, "class": 0, "label": "person"}
    assert detect(out, conf=0.95) == []  # no candidate: none, not an error
    many = yolo_output([(8 * k, 8, 4, 4, 0, 0.5 + k / 100) for k in range(12)], n=12)
    assert len(detect(many, max_det=5)) == 5  # twelve apart: five, the best
    assert [round(d.score, 2) for d in detect(many, max_det=5)] == [0.61, 0.6, 0.59, 0.58, 0.57]


def test_an_end_to_end_head_is_taken_as_it_is():
    rows = np.array([[[1, 2, 3, 4, 0.3, 2], [5, 6, 7, 8, 0.9, 1], [0, 0, 1, 1, 0.1, 0]]],
                    np.float32)
    found = detect(rows, conf=0.25)
    assert [(d.box, d.cls) for d in found] == [((5.0, 6.0, 7.0, 8.0), 1), ((1.0, 2.0, 3.0, 4.0), 2)]


def test_an_output_of_another_shape_is_refused_by_its_shape():
    assert layout((1, 84, 8400)) == "yolo" and layout((1, 300, 6)) == "end2end"
    with pytest.raises(AutodiceError, match="the output is 1x1000, neither"):
        layout((1, 1000))


def test_the_letterbox_maps_boxes_back_to_the_source():
    # A 640x480 image into 320x320: scale 0.5, 40 px of grey above and below.
    box = Letterbox.fit((640, 480), (320, 320))
    assert (box.scale, box.pad) == (0.5, (0.0, 40.0))
    got = box.to_source(np.array([[10, 50, 110, 150], [-5, 0, 400, 400]], np.float32))
    assert got.tolist() == [[20, 20, 220, 220], [0, 0, 640, 480]]  # clipped to the image
    img = Image.new("RGB", (640, 480), (255, 0, 0))
    frame, made = letterbox(img, (1, 3, 320, 320))
    assert made == box and frame.shape == (1, 3, 320, 320) and frame.dtype == np.float32
    grey, red = 114 / 255, (1, 0, 0)
    for row, want in ((0, grey), (39, grey), (40, red), (279, red), (280, grey)):
        assert np.allclose(frame[0, :, row, 5], want), row


def test_a_live_source_gives_the_newest_frame_and_counts_the_rest():
    """A camera or a stream does not wait: a thread reads it as fast as it comes and the taker
    gets the newest item each time; what it could not take is counted, none is taken twice or
    out of order, and an error of the source reaches the taker."""
    from autodice.backend.session.video import Newest

    def source(n, fail=False):
        for i in range(n):
            time.sleep(0.002)
            yield i
        if fail:
            raise OSError("the stream went away")

    taken = []
    newest = Newest(source(200))
    for item in newest:
        taken.append(item)
        time.sleep(0.01)  # a pipeline slower than the camera
    assert taken == sorted(set(taken)) and taken[-1] == 199
    assert 0 < newest.dropped and len(taken) + newest.dropped == 200
    assert threading.active_count() < 50
    with pytest.raises(OSError, match="the stream went away"):
        list(Newest(source(3, fail=True)))


@pytest.mark.parametrize("side", [64, 200])
def test_a_video_frame_is_letterboxed_as_its_picture(tmp_path, side):
    """FFmpeg scales a decoded frame as Pillow scales its picture, within about a level of 255
    on average, down and up (FFmpeg converts colours a little more exactly: the clip's red
    220 stays 220, where the picture has 218); the letterbox and the grey are the same."""
    import av
    from test_detector import moving_shapes

    moving_shapes(tmp_path / "clip.mp4", frames=4)
    with av.open(str(tmp_path / "clip.mp4")) as clip:
        for frame in clip.decode(video=0):
            got, box = letterbox(frame, (1, 3, side, side))
            want, same = letterbox(frame.to_image(), (1, 3, side, side))
            assert box == same and got.dtype == want.dtype == np.float32
            rows = round(80 * box.scale)  # 96x80 fits the width: grey above and below
            top = int(box.pad[1])
            assert np.array_equal(got[..., :top, :], want[..., :top, :])
            assert np.array_equal(got[..., top + rows:, :], want[..., top + rows:, :])
            assert np.all(got[..., :top, :] == np.float32(114) / np.float32(255))
            inside = np.abs(got - want)[..., top:top + rows, :]
            assert inside.mean() < 2 / 255 and np.median(inside) <= 1 / 255


@pytest.mark.parametrize("shape", [(1, 3, 48, 48), (1, 3, 224, 224), (1, 1, 32, 40)])
def test_a_video_frame_is_made_by_the_recipe_as_its_picture(tmp_path, shape):
    """A classifier's recipe (the shorter side scaled, the centre cropped) on a decoded frame,
    FFmpeg scaling it whole then cropping, gives what Pillow's one resample of the crop gives
    its picture, within about a level of 255 on average; grey too."""
    import av
    from test_detector import moving_shapes

    from autodice.backend.session.frames import ImageRecipe

    recipe = ImageRecipe(mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))  # values: pixels / 255
    moving_shapes(tmp_path / "clip.mp4", frames=3)
    with av.open(str(tmp_path / "clip.mp4")) as clip:
        for frame in clip.decode(video=0):
            got = recipe.apply(frame, shape, np.float32)
            want = recipe.apply(frame.to_image(), shape, np.float32)
            assert got.shape == want.shape == shape and got.dtype == np.float32
            gap = np.abs(got - want)
            assert gap.mean() < 2 / 255 and np.median(gap) <= 1.5 / 255, gap.mean() * 255


def test_a_video_read_live_drops_what_a_slow_pipeline_cannot_take(tmp_path):
    from test_detector import moving_shapes

    from autodice.backend.session.video import video_frames

    moving_shapes(tmp_path / "clip.mp4", frames=30)
    count, frames = video_frames(str(tmp_path / "clip.mp4"), lambda p: ((p.width, p.height),),
                                 live=True)
    assert count is None
    got = []
    for label, size in frames:
        got.append(int(label))
        time.sleep(0.05)  # a pipeline slower than the camera
    assert got == sorted(got) and size == (96, 80)
    assert frames.dropped > 0 and len(got) + frames.dropped == 30


def _serve_twice(data: bytes) -> int:
    """A TCP server on loopback that sends ``data`` to the first two clients, closing each
    connection after it (the stream is lost), then stops listening (it does not come back)."""
    import socket

    server = socket.create_server(("127.0.0.1", 0))

    def serve():
        with server:
            for _ in range(2):
                conn, _ = server.accept()
                with conn:
                    conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1]


def test_a_lost_live_stream_is_reconnected_then_a_clear_error(tmp_path, monkeypatch, capfd):
    """An MPEG-TS stream over TCP (loopback) that breaks: it is opened again after the first
    wait and its frames go on, numbered on; when it breaks again and does not come back, each
    attempt is said and the stream ends with one line naming the source."""
    import av

    from autodice.backend.session import video
    from autodice.core.errors import JobError

    with av.open(str(tmp_path / "clip.ts"), "w", format="mpegts") as out:
        stream = out.add_stream("mpeg4", rate=25)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(10):
            image = np.full((48, 64, 3), 20 * i, np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    port = _serve_twice((tmp_path / "clip.ts").read_bytes())
    monkeypatch.setattr(video, "RECONNECT_S", (0.05, 0.1))
    source = f"tcp://127.0.0.1:{port}"
    _, frames = video.video_frames(source, lambda picture: ((picture.width, picture.height),))
    got = []
    with pytest.raises(JobError) as e:
        for label, size in frames:
            got.append(int(label))
            assert size == (64, 48)
    assert got == sorted(set(got)) and max(got) >= 10  # frames of the second connection
    assert e.value.problems[0].startswith(f"{source}: lost (") and e.value.problems[0].endswith(
        "not back after 2 attempts over 0.15 s; the frames before it were delivered")
    said = capfd.readouterr().err
    assert f"{source}: lost at frame 10 (it ended); reconnecting in 0.05 s (attempt 1 of 2)" in said
    assert f"{source}: back at frame 10" in said and "(attempt 2 of 2)" in said


@pytest.mark.parametrize("spec, want", [
    ("rtsp://cam.local:554/stream?channel=1&subtype=0", "rtsp://cam.local:554/stream?channel=1&subtype=0"),
    ("images=rtsp://cam/x", "rtsp://cam/x"),
    ("clip.mp4", Path("clip.mp4")),
])
def test_a_stream_url_reaches_the_reader_as_it_was_given(spec, want):
    """``--input rtsp://...`` was made a Path (``rtsp:/...``) and then refused as no video."""
    from types import SimpleNamespace

    from autodice.cli.app import model_inputs

    plan = SimpleNamespace(model_inputs=[SimpleNamespace(name="images")])
    assert model_inputs(plan, [spec]) == {"images": want}
