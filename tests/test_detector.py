"""A detector's shape through the whole chain without torch: ``graphs.yolo_like`` (three scales,
the neck's Resize and Concat, heads flattened and concatenated, the Split of boxes and scores,
DFL's softmax, anchors) split over three keys with cuts where detectors are cut, gen'd, built
and run under mpirun, equal to onnxruntime; then a video through it with ``--task detect``,
boxes equal to onnxruntime's on the same frames."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from graphs import yolo_like

import autodice
from autodice.backend.session.detect import detect, letterbox
from autodice.cli import main
from autodice.core.model import load_model

pytestmark = pytest.mark.cpp

SIDE, CLASSES = 64, 8
SOURCE = (96, 80)  # the clip's width and height: letterboxed into 64x64 with grey above/below


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    """yolo_like split over three keys (cuts in the neck and the head), gen'd and built."""
    d = tmp_path_factory.mktemp("detector")
    onnx.save(yolo_like(side=SIDE, classes=CLASSES), d / "model.onnx")
    names = load_model(d / "model.onnx").layer_names
    backbone = names[:names.index("b4") + 1]
    rest = names[len(backbone):]
    last_scale = [n for n in rest if n.startswith("h2")]
    # Key 1 takes the neck and two heads up to the Split, and the DFL's softmax; key 2 the last
    # scale's head and what follows the Split: the multi-scale Concat, the Split and the DFL
    # each have a tensor on the wire (the DFL's there and back).
    middle = [n for n in rest[:rest.index("split") + 1] if n not in last_scale] + ["dfl.s"]
    mapping = {"edge01_cpu0": backbone, "edge02_cpu1": middle,
               "edge03_cpu0": [n for n in rest if n not in middle]}
    (d / "mapping.json").write_text(json.dumps(mapping))
    (d / "platform.txt").write_text("edge01, cpu, slots=0\nedge02, cpu, slots=1\n"
                                    "edge03, cpu, slots=0\n")
    plan = autodice.split(d / "model.onnx", d / "mapping.json", d / "platform.txt", d / "out")
    assert {"h2.flat", "box", "cls", "dfl.t", "dfl.s"} <= {e.tensor for e in plan.edges}
    autodice.gen(d / "out")
    autodice.build(d / "out")
    return d


def test_a_yolo_shaped_detector_cut_in_its_neck_and_head_runs_like_onnxruntime(detector,
                                                                              tmp_path):
    x = np.random.default_rng(0).random((1, 3, SIDE, SIDE)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    got = autodice.run(detector / "out", {"images": tmp_path / "x.npy"}, frames=3)
    want = ort.InferenceSession(str(detector / "model.onnx")).run(None, {"images": x})[0]
    out = got.outputs["output0"]
    assert out.shape == want.shape == (1, 4 + CLASSES, 84)
    assert np.abs(out - want).max() <= 1e-4 * np.abs(want).max()


def moving_shapes(path, frames: int = 12) -> None:
    """An MPEG-4 clip of coloured rectangles that move, encoded here with PyAV (FFmpeg)."""
    import av

    w, h = SOURCE
    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        for i in range(frames):
            img = np.full((h, w, 3), 30, np.uint8)
            img[10 + i:40 + i, 5 + 3 * i:35 + 3 * i] = (220, 40, 40)
            img[50:70, 60 - 2 * i:90 - 2 * i] = (40, 200, 60)
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def decoded(path) -> list:
    """The clip's frames as a session decodes them (PyAV's frames, made RGB when letterboxed)."""
    import av

    with av.open(str(path)) as clip:
        return list(clip.decode(video=0))


def test_a_video_through_the_detector_gives_onnxruntimes_boxes(detector, tmp_path):
    """``run --input clip.mp4 --task detect``: each frame decoded, letterboxed, run over the
    three keys; detections.jsonl holds a line a frame whose boxes (in the clip's pixels) are
    those onnxruntime's output gives through the same decoding and NMS."""
    moving_shapes(tmp_path / "clip.mp4")
    labels = tmp_path / "names.txt"
    labels.write_text("".join(f"thing{k}\n" for k in range(CLASSES)))
    said = CliRunner().invoke(main, ["run", str(detector / "out"), "--input",
                                     str(tmp_path / "clip.mp4"), "--task", "detect",
                                     "--conf", "0.3", "--labels", str(labels),
                                     "--annotate", str(tmp_path / "boxes.mp4"),
                                     "--results", str(tmp_path / "r")])
    assert said.exit_code == 0, said.output
    lines = [json.loads(ln) for ln in (tmp_path / "r" / "detections.jsonl").read_text()
             .splitlines()]
    ref = ort.InferenceSession(str(detector / "model.onnx"))
    frames = decoded(tmp_path / "clip.mp4")
    assert [ln["frame"] for ln in lines] == list(range(len(frames))) == list(range(12))
    found = 0
    for line, image in zip(lines, frames):
        x, box = letterbox(image, (1, 3, SIDE, SIDE))
        want = detect(ref.run(None, {"images": x})[0], conf=0.3, box=box)
        got = line["detections"]
        assert [d["class"] for d in got] == [d.cls for d in want], line["frame"]
        assert np.allclose([d["box"] for d in got], [d.box for d in want], atol=0.02)
        assert np.allclose([d["score"] for d in got], [d.score for d in want], atol=1e-4)
        assert all(d["label"] == f"thing{d['class']}" for d in got)
        assert all(0 <= d["box"][0] <= d["box"][2] <= SOURCE[0]
                   and 0 <= d["box"][1] <= d["box"][3] <= SOURCE[1] for d in got)
        found += len(got)
    assert found  # the seeded head finds something to compare
    text = [ln for ln in said.stdout.splitlines() if ln.split(":")[0].isdigit()]
    assert len(text) == 12 and text[0].startswith("0: ") and " box" in text[0]
    records = json.loads((tmp_path / "r" / "frames.json").read_text())
    assert [r["detections"] for r in records] == [ln["detections"] for ln in lines]
    drawn = [f.to_image() for f in decoded(tmp_path / "boxes.mp4")]  # boxes on every frame
    assert [p.size for p in drawn] == [SOURCE] * 12
    assert not np.array_equal(np.asarray(drawn[0]), np.asarray(frames[0].to_image()))


def test_a_folder_of_pictures_gets_a_folder_of_annotated_pictures(detector, tmp_path):
    """``autodice.run(out, "photos/", task="detect", annotate=DIR)``: a picture a source
    picture, named after it, its size, with its boxes; the records hold the boxes."""
    from PIL import Image

    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(7)
    for name, (w, h) in (("a.png", (96, 80)), ("b.jpg", (40, 90))):
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(photos / name)
    res = autodice.run(detector / "out", photos, task="detect", conf=0.3,
                       annotate=tmp_path / "drawn")
    assert [r["frame"] for r in res.records] == ["a.png", "b.jpg"]
    assert all("detections" in r for r in res.records)
    drawn = sorted((tmp_path / "drawn").iterdir())
    assert [p.name for p in drawn] == ["a.jpg", "b.jpg"]
    assert [Image.open(p).size for p in drawn] == [(96, 80), (40, 90)]


def test_detect_refuses_what_it_cannot_read_in_one_line(detector, fig2_built, tmp_path):
    """Settings out of range, an output of no detector, a video that cannot be opened: one
    line each, exit 2, before any job starts and with nothing written."""
    (tmp_path / "bad.mp4").write_bytes(b"not a video at all")
    (tmp_path / "images").mkdir()
    cases = [
        ([str(detector / "out"), "--input", str(tmp_path / "bad.mp4"), "--task", "detect"],
         f"{tmp_path / 'bad.mp4'}: cannot open it as a video"),
        ([str(detector / "out"), "--input", str(tmp_path / "none.mp4"), "--task", "detect"],
         f"{tmp_path / 'none.mp4'}: no such video"),
        ([str(detector / "out"), "--input", str(tmp_path / "images"), "--task", "detect",
          "--conf", "1.5", "--max-det", "0"], "--conf 1.5: from 0 to 1"),
        ([str(fig2_built / "out"), "--input", str(tmp_path / "images"), "--task", "detect"],
         "--task detect: the output is 1x4x4x4, neither a YOLO head's"),
    ]
    for args, first in cases:
        said = CliRunner().invoke(main, ["run", *args, "--results", str(tmp_path / "r")])
        assert said.exit_code == 2, said.output
        assert said.stderr.splitlines()[0].startswith(f"error: {first}"), said.stderr
        assert not (tmp_path / "r").exists()


def test_a_detector_session_gives_each_frame_its_boxes(detector, tmp_path):
    """``autodice.open(out, task="detect")``: a picture (a PIL image, or a video frame PyAV
    decoded) is letterboxed and its boxes come back in its own pixels, an array's in the
    input's; the same as onnxruntime's, through map and infer alike."""
    from PIL import Image

    rng = np.random.default_rng(4)
    moving_shapes(tmp_path / "clip.mp4", frames=2)
    pictures = [Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
                for w, h in ((96, 80), (50, 120))] + decoded(tmp_path / "clip.mp4")[1:]
    array = rng.random((1, 3, SIDE, SIDE)).astype(np.float32)
    ref = ort.InferenceSession(str(detector / "model.onnx"))

    def want(frame):
        x, box = letterbox(frame, (1, 3, SIDE, SIDE)) if not isinstance(frame, np.ndarray) \
            else (frame, None)
        return detect(ref.run(None, {"images": x})[0], conf=0.3, box=box)

    with autodice.open(detector / "out", task="detect", conf=0.3) as s:
        got = list(s.map([*pictures, array]))
        once = s.infer(pictures[1])
    for frame, boxes in zip([*pictures, array, pictures[1]], [*got, once]):
        expected = want(frame)
        assert [d.cls for d in boxes] == [d.cls for d in expected]
        assert np.allclose([d.box for d in boxes], [d.box for d in expected], atol=0.02)
    assert sum(map(len, got)) > 0
    assert max(d.box[3] for d in got[1]) > SIDE  # the tall picture's boxes, in its pixels


def test_a_stream_url_is_read_live_and_what_the_pipeline_cannot_take_is_dropped(detector,
                                                                                 tmp_path):
    """A video over HTTP (loopback) is a live source: every frame the pipeline takes is the
    newest there was, the rest are counted as dropped; none comes twice, and the taken frames'
    boxes are written a line each."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    moving_shapes(tmp_path / "clip.mp4", frames=40)
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/clip.mp4"
        res = autodice.run(detector / "out", url, task="detect", conf=0.3)
    finally:
        server.shutdown()
    taken = [int(r["frame"]) for r in res.records]
    assert taken == sorted(set(taken)) and taken
    assert res.stats["frames_dropped"] == 40 - len(taken)
    lines = (detector / "out" / "results" / "detections.jsonl").read_text().splitlines()
    assert [json.loads(ln)["source"] for ln in lines] == [str(i) for i in taken]


def test_pictures_through_a_yolo_head_are_read_as_boxes_without_being_told(detector, tmp_path):
    """No --task: a video through an output that can only be a YOLO head's is read as boxes,
    and the run says so; --task none keeps the outputs alone."""
    moving_shapes(tmp_path / "clip.mp4", frames=3)
    run = ["run", str(detector / "out"), "--input", str(tmp_path / "clip.mp4"), "--conf", "0.3"]
    said = CliRunner().invoke(main, [*run, "--results", str(tmp_path / "r")])
    assert said.exit_code == 0, said.output
    assert f"--task detect: output0 is 1x{4 + CLASSES}x84, a YOLO head's output" in said.stderr
    assert len((tmp_path / "r" / "detections.jsonl").read_text().splitlines()) == 3
    plain = CliRunner().invoke(main, [*run[:-2], "--task", "none", "--results",
                                      str(tmp_path / "plain")])
    assert plain.exit_code == 0, plain.output
    assert not (tmp_path / "plain" / "detections.jsonl").exists()
    assert "--task detect" not in plain.stderr


@pytest.mark.parametrize("inputs, output, source, task", [
    ((1, 3, 640, 640), (1, 84, 8400), "clip.mp4", "detect"),  # YOLOv8n/YOLO11n at 640
    ((1, 3, 320, 320), (1, 300, 6), "photos", "detect"),  # YOLO26n's end-to-end head
    ((1, 3, 640, 640), (1, 84, 8400), "batch.npy", None),  # frames as they are: no letterbox
    ((1, 3, 224, 224), (1, 197, 768), "photos", None),  # a ViT's tokens are no boxes
    ((1, 3, 640, 640), (1, 84, 2100), "photos", None),  # anchors of another input size
    ((1, 3, 520, 520), (1, 21, 520, 520), "photos", None),  # a segmenter's: also an image's
])
def test_a_task_is_inferred_only_where_the_output_leaves_no_doubt(tmp_path, inputs, output,
                                                                  source, task):
    from types import SimpleNamespace

    from autodice.backend.session.results import inferred_task

    (tmp_path / "photos").mkdir()
    plan = SimpleNamespace(model_inputs=[SimpleNamespace(shape=inputs)],
                           model_outputs=[SimpleNamespace(shape=output)])
    assert inferred_task(plan, tmp_path / source) == task


def test_a_live_stream_that_is_lost_for_good_ends_the_run_keeping_what_came(detector, tmp_path,
                                                                           monkeypatch):
    """``run --input tcp://...`` whose server goes away: reconnect attempts on stderr, one
    error line naming the source, exit 4, and detections.jsonl a line for each frame
    delivered before."""
    import av
    from test_detections import _serve_twice

    from autodice.backend.session import video

    moving_shapes(tmp_path / "clip.mp4", frames=8)
    with av.open(str(tmp_path / "clip.mp4")) as clip, \
            av.open(str(tmp_path / "clip.ts"), "w", format="mpegts") as out:
        stream = out.add_stream("mpeg4", rate=25)
        stream.width, stream.height, stream.pix_fmt = SOURCE[0], SOURCE[1], "yuv420p"
        for frame in clip.decode(video=0):
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    monkeypatch.setattr(video, "RECONNECT_S", (0.05,))
    source = f"tcp://127.0.0.1:{_serve_twice((tmp_path / 'clip.ts').read_bytes())}"
    said = CliRunner().invoke(main, ["run", str(detector / "out"), "--input", source,
                                     "--task", "detect", "--conf", "0.3", "--results",
                                     str(tmp_path / "r")])
    assert said.exit_code == 4, said.output
    errors = [ln for ln in said.stderr.splitlines() if ln.startswith("error:")]
    # Back once (the server's second connection), then refused: the last reason is named.
    assert errors == [f"error: {source}: lost (cannot open it as a video (Connection refused)) "
                      "and not back after 1 attempt over 0.05 s; the frames before it were "
                      "delivered"]
    assert said.stderr.count("reconnecting in 0.05 s (attempt 1 of 1)") == 2
    assert f"{source}: back at frame" in said.stderr
    lines = (tmp_path / "r" / "detections.jsonl").read_text().splitlines()
    records = json.loads((tmp_path / "r" / "frames.json").read_text())
    assert lines and len(lines) == len(records)
    assert [json.loads(ln)["source"] for ln in lines] == [r["frame"] for r in records]


RTSP_PACKAGES = ("gir1.2-gst-rtsp-server-1.0", "gstreamer1.0-plugins-base",
                 "gstreamer1.0-plugins-good")  # the server, videotestsrc, jpegenc + rtpjpegpay


@pytest.fixture
def camera():
    """camera(seconds=None) -> the rtsp:// URL of a live camera on loopback (tests/rtsp_server.py,
    GStreamer's RTSP server; its Debian packages installed where missing and apt-get can), gone
    after ``seconds``."""
    import fcntl
    import shutil
    import subprocess
    from pathlib import Path

    script = Path(__file__).with_name("rtsp_server.py")
    probe = ["/usr/bin/python3", "-c", "import gi; gi.require_version('GstRtspServer', '1.0')"]
    if subprocess.run(probe, capture_output=True).returncode != 0:
        if not shutil.which("apt-get") or os.geteuid() != 0:
            pytest.skip(f"no GStreamer RTSP server ({' '.join(RTSP_PACKAGES)}) and no apt-get")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        with open("/tmp/autodice-tests-apt.lock", "w") as lock:  # one worker installs
            fcntl.flock(lock, fcntl.LOCK_EX)
            if subprocess.run(probe, capture_output=True).returncode != 0:
                for cmd in (["apt-get", "update", "-q"],
                            ["apt-get", "install", "-y", "-q", "--no-install-recommends",
                             *RTSP_PACKAGES]):
                    subprocess.run(cmd, check=True, capture_output=True, env=env)
    servers = []

    def start(seconds: float | None = None) -> str:
        proc = subprocess.Popen(["/usr/bin/python3", str(script),
                                 *([str(seconds)] if seconds else [])],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        servers.append(proc)
        line = proc.stdout.readline().strip()
        assert line.startswith("serving rtsp://127.0.0.1:"), line
        return line.split()[1]

    yield start
    for proc in servers:
        proc.kill()
        proc.wait()


def test_a_camera_over_rtsp_is_read_live(detector, camera, tmp_path):
    """``run --input rtsp://... --frames 30`` from a camera on loopback: 30 of its newest
    frames, a line of boxes each; the ones the pipeline could not take (while it started, too)
    counted as dropped."""
    url = camera()
    said = CliRunner().invoke(main, ["run", str(detector / "out"), "--input", url, "--frames",
                                     "30", "--task", "detect", "--conf", "0.3", "--results",
                                     str(tmp_path / "r")])
    assert said.exit_code == 0, said.output
    records = json.loads((tmp_path / "r" / "frames.json").read_text())
    lines = (tmp_path / "r" / "detections.jsonl").read_text().splitlines()
    taken = [int(r["frame"]) for r in records]
    assert len(taken) == 30 and taken == sorted(set(taken)) and len(lines) == 30
    stats = json.loads((tmp_path / "r" / "stats.json").read_text())
    assert stats["frames_dropped"] == taken[-1] + 1 - 30  # the camera's frames not taken


def test_a_camera_that_goes_away_ends_the_run_keeping_what_came(detector, camera, tmp_path,
                                                                monkeypatch):
    """The RTSP server stops: a reconnect attempt, one error line naming the camera, exit 4,
    and a line of boxes for every frame delivered before."""
    from autodice.backend.session import video

    monkeypatch.setattr(video, "RECONNECT_S", (0.05,))
    url = camera(seconds=10)
    said = CliRunner().invoke(main, ["run", str(detector / "out"), "--input", url, "--task",
                                     "detect", "--conf", "0.3", "--results",
                                     str(tmp_path / "r")])
    assert said.exit_code == 4, said.output
    errors = [ln for ln in said.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {url}: lost ("), errors
    assert errors[0].endswith("and not back after 1 attempt over 0.05 s; the frames before it "
                              "were delivered"), errors
    assert "reconnecting in 0.05 s (attempt 1 of 1)" in said.stderr
    lines = (tmp_path / "r" / "detections.jsonl").read_text().splitlines()
    assert lines and len(lines) == len(json.loads((tmp_path / "r" / "frames.json").read_text()))
