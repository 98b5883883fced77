"""Sessions: real frames streamed through a running job (the gateway rank, mpirun, ncnn), each
result against onnxruntime on its own frame, bad frames, an early stop, a rank that dies.

The job is Figure 2 with all three kinds of parallelism (specs/figure2/three-kinds.json): a layer
split by rows over two ranks and a stage with a replica, so results come back in order only if
the gateway puts them in order.

    frame -> gateway -> arm1 (MaxPool1, Conv1 rows, Add1) -> arm3 | arm4 (Relu1, in turn)
                        arm2 (Conv1 rows, FC1)            -> gateway -> result
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import replace
from importlib import resources
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from conftest import SPECS
from graphs import conv_chain, input_skip, wide_chain
from onnx import helper

import autodice
from autodice.backend.session import FrameError, SessionError, figures, frame_copy
from autodice.backend.session.frames import ImageRecipe, frames_from
from autodice.cli import main
from autodice.frontend.check import session as ort_session

pytestmark = pytest.mark.cpp


@pytest.fixture
def built(fig2_built):
    return fig2_built


def frames(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 4, 8, 8)).astype(np.float32) for _ in range(n)]


def reference(model: Path, xs: list[np.ndarray]) -> list[np.ndarray]:
    whole = ort_session(model)
    name = whole.get_inputs()[0].name
    return [whole.run(None, {name: x})[0] for x in xs]


def programs(out: Path) -> list[int]:
    """Pids of processes running this output's program."""
    exe = str((out / "build" / "local" / "program").resolve())
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if os.readlink(p / "exe").removesuffix(" (deleted)") == exe:
                    found.append(int(p.name))
            except OSError:
                continue
    return found


def rank_pid(out: Path, rank: int) -> int:
    for pid in programs(out):
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            return pid
    raise AssertionError(f"no process of rank {rank}")


def test_distinct_frames_come_back_in_order_equal_to_onnxruntime(built):
    xs = frames(300)
    want = reference(built / "model.onnx", xs)
    with autodice.open(built / "out") as s:
        got = list(s.map(iter(xs)))  # any iterable: a generator too
        assert np.array_equal(s.infer(xs[7]), got[7])
        mid = s.stats()
    assert len(got) == 300
    for i, (g, w) in enumerate(zip(got, want)):
        assert np.abs(g - w).max() <= 1e-5 * np.abs(w).max(), f"frame {i}"
    # Replicated ranks took every other frame; the stats say so, and latency was measured.
    st = s.stats()
    assert mid["frames"] == st["frames"] == 301 and st["fps"] > 0 and st["steady_fps"] > 0
    assert st["frames_via"] == "shared memory"  # a job on this machine
    assert 0 < st["latency_s"]["p50"] <= st["latency_s"]["p99"]
    by_key = {r["key"]: r for r in st["ranks"]}
    assert by_key["edge01_arm3"]["frames"] + by_key["edge01_arm4"]["frames"] == 301
    assert by_key["edge01_arm1"]["frames"] == 301
    # The rank that reads the model input read it from the session's slots itself.
    from_slots = [by_key[f"edge01_arm{k}"]["frames_from_slots"] for k in (1, 2, 3, 4)]
    assert from_slots == [301, 0, 0, 0]
    assert not programs(built / "out")


def test_ranks_that_do_not_map_the_slots_receive_each_frame(built, monkeypatch):
    """AUTODICE_MAP_SLOTS=0: the ranks decline the gateway's slots, as ranks on another machine
    find them not theirs, and the gateway sends them each frame from its slot over MPI."""
    monkeypatch.setenv("AUTODICE_MAP_SLOTS", "0")
    xs = frames(60, seed=3)
    want = reference(built / "model.onnx", xs)
    with autodice.open(built / "out") as s:
        got = list(s.map(xs))
    st = s.stats()
    assert st["frames_via"] == "shared memory"
    assert [r["frames_from_slots"] for r in st["ranks"]] == [0, 0, 0, 0]
    for i, (g, w) in enumerate(zip(got, want)):
        assert np.abs(g - w).max() <= 1e-5 * np.abs(w).max(), f"frame {i}"


def test_the_ranks_say_how_long_they_waited_for_the_gateways_next_frame(built):
    """A caller that pauses between frames: the first stage's wait for the gateway's word is
    frame_wait, not a wait for a peer's tensor."""
    pause_s, n = 0.2, 6
    with autodice.open(built / "out") as s:
        for x in frames(n):
            s.infer(x)
            time.sleep(pause_s)
    first = next(r for r in s.stats()["ranks"] if r["key"] == "edge01_arm1")
    assert first["frame_wait_s"] >= (n - 1) * pause_s
    assert first["recv_wait_s"] < pause_s
    assert first["ms_per_frame"]["frame_wait"] == pytest.approx(1e3 * first["frame_wait_s"] / n)


def test_frames_go_on_the_socket_where_no_shared_memory_can_be_made(built, monkeypatch):
    """No memfd (another OS, an old kernel, no room): no offer is made, and the frames travel on
    the socket as to a gateway behind ssh, checked there too."""
    def no_memfd(*_):
        raise OSError(errno.ENOSYS, "memfd_create is not implemented")

    monkeypatch.setattr(os, "memfd_create", no_memfd)
    xs = frames(40)
    want = reference(built / "model.onnx", xs)
    nan = xs[0].copy()
    nan[0, 0, 0, 0] = np.nan
    with autodice.open(built / "out") as s:
        got = list(s.map(xs[:20] + [nan] + xs[20:]))
    assert s.stats()["frames_via"] == "socket"
    assert isinstance(got.pop(20), FrameError)
    assert len(got) == 40
    for i, (g, w) in enumerate(zip(got, want)):
        assert np.abs(g - w).max() <= 1e-5 * np.abs(w).max(), f"frame {i}"


def test_steady_rate_leaves_out_each_streams_first_result():
    """Two streams on a made-up clock: frames/s counts each stream from its first send, the
    steady rate only the gaps between its results (the pipeline full), as stats.json's does."""
    f = figures.Figures(clock=iter([1.0, 1.5, 2.0, 12.0, 12.25]).__next__)
    for sent, first in ((0.0, True), (0.5, False), (1.0, False), (11.0, True), (11.5, False)):
        f.delivered_one(sent, first)
    got = f.summary()
    assert got["frames"] == 5 and got["seconds"] == 2.0 + 1.25
    assert got["fps"] == 5 / 3.25 and got["steady_fps"] == 3 / 1.25
    assert got["latency_s"]["p50"] == 1.0
    assert figures.Figures().summary()["steady_fps"] is None


def test_a_long_streams_latency_is_kept_in_bounded_memory(monkeypatch):
    """A stream that runs for days: the percentiles are over the last LATENCY_KEPT frames (a
    ring), the histogram and the count over all of them."""
    monkeypatch.setattr(figures, "LATENCY_KEPT", 1000)
    clock = iter(np.arange(1, 3001, dtype=float)).__next__
    f = figures.Figures(clock=clock)
    for k in range(3000):  # latency 0.5 s for the first 2000 frames, then 0.001 s
        f.delivered_one(k + 1 - (0.5 if k < 2000 else 0.001), first=k == 0)
    got = f.summary()
    assert got["frames"] == 3000 and len(f._latency) == 1000
    assert got["latency_s"]["p99"] == pytest.approx(0.001)  # the last 1000 frames only
    assert sum(f.buckets) == 3000 and f.latency_sum == pytest.approx(2000 * 0.5 + 1000 * 0.001)


def test_a_bad_frame_gets_its_error_and_the_stream_goes_on(built):
    good = frames(3, seed=1)
    want = reference(built / "model.onnx", good)
    bad_shape = np.zeros((1, 4, 8, 9), np.float32)
    nan = good[0].copy()
    nan[0, 1, 2, 3] = np.nan
    with autodice.open(built / "out") as s:
        got = list(s.map([good[0], bad_shape, good[0].astype(np.float64), nan,
                          {"nope": good[0]}, good[1], good[2][0]]))
        kinds = [type(g).__name__ for g in got]
        assert kinds == ["ndarray", "FrameError", "FrameError", "FrameError", "FrameError",
                         "ndarray", "ndarray"]
        assert [g.index for g in got if isinstance(g, FrameError)] == [1, 2, 3, 4]
        assert 'input "input" must be 1x4x8x8 float32, got 1x4x8x9' in str(got[1])
        assert "must be float32, got float64" in str(got[2])
        assert "NaN" in str(got[3])
        assert 'no input "nope"' in str(got[4])
        for g, w in zip([got[0], got[5], got[6]], want):  # a frame without its batch axis too
            assert np.abs(g - w).max() <= 1e-5 * np.abs(w).max()
        with pytest.raises(FrameError, match="frame 0: input"):
            s.infer(bad_shape)
        with pytest.raises(FrameError, match="NaN"):  # refused before it is in flight
            s.infer(nan)
        y = s.infer(good[1])
        assert np.abs(y - want[1]).max() <= 1e-5 * np.abs(want[1]).max()


@pytest.mark.parametrize("helper", ["C", "numpy"])
def test_a_frame_is_copied_into_its_slot_and_checked_in_one_pass(helper, monkeypatch):
    """runtime_cpp/frame_copy.c against numpy: the same bytes wherever the slot starts and however
    long the tensor (its streaming stores go 64 bytes at a time from a 32-byte boundary), and NaN
    or infinity found before, in and after that body. A machine without a compiler copies with
    numpy: the same answers."""
    if helper == "numpy":
        monkeypatch.setattr(frame_copy, "_helper", lambda: (None, "numpy asked for"))
    else:
        assert frame_copy.prepare() is None  # this machine builds it: the fast path runs
    rng = np.random.default_rng(0)
    buf = np.zeros(4 * 150528 + 64, np.uint8)
    base = (-buf.ctypes.data) % 32  # a 32-byte boundary in buf
    for n in (0, 1, 3, 4, 5, 16, 17, 31, 33, 1000, 150528):
        x = rng.standard_normal(n).astype(np.float32)
        for offset in (0, 4, 12, 16, 28):
            dst = buf[base + offset:base + offset + 4 * n]
            assert frame_copy.copy_frame(dst, memoryview(x).cast("B"), True)
            assert dst.tobytes() == x.tobytes()
            for at in {0, n // 2, n - 1} if n else ():
                for bad in (np.nan, np.inf, -np.inf):
                    y = x.copy()
                    y[at] = bad
                    assert not frame_copy.copy_frame(dst, memoryview(y).cast("B"), True)
                    assert dst.tobytes() == y.tobytes()  # copied all the same
                    assert frame_copy.copy_frame(dst, memoryview(y).cast("B"), False)
    ints = np.arange(-7, 9, dtype=np.int64)  # an int64 input: bytes, never a check
    dst = buf[base + 4:base + 4 + ints.nbytes]
    assert frame_copy.copy_frame(dst, memoryview(ints).cast("B"), False)
    assert dst.tobytes() == ints.tobytes()


_ARM_HARNESS = r"""
#include <math.h>
#include <stdio.h>
#include <string.h>
int autodice_copy_frame(void* dst, const void* src, size_t bytes, int f32);
static float src[40000], dst[40004];
int main(void) {
  int fails = 0, at[] = {0, 4095, 4096, 20000, 39999};
  for (int i = 0; i < 40000; ++i) src[i] = (float)i * 0.5f - 7;
  for (int shift = 0; shift < 4; ++shift) {
    fails += !autodice_copy_frame(dst + shift, src, sizeof src, 1);
    fails += memcmp(dst + shift, src, sizeof src) != 0;
    for (int k = 0; k < 5; ++k) {
      src[at[k]] = k % 2 ? INFINITY : -NAN;
      fails += autodice_copy_frame(dst + shift, src, sizeof src, 1);
      fails += memcmp(dst + shift, src, sizeof src) != 0;
      fails += !autodice_copy_frame(dst + shift, src, sizeof src, 0);
      src[at[k]] = 1;
    }
  }
  printf("fails %d\n", fails);
  return fails != 0;
}
"""


def test_the_frame_copy_of_an_aarch64_board(tmp_path):
    """A session on an aarch64 board builds the helper's portable path: cross-compiled here and
    run under qemu-user, it copies and finds NaN and infinity as x86-64's does."""
    from autodice.deploy.emulated.arm_board import QEMU
    if not (QEMU.exists() and shutil.which("aarch64-linux-gnu-gcc")):
        pytest.skip("needs qemu-user-static and gcc-aarch64-linux-gnu (`make test` installs them)")
    (tmp_path / "main.c").write_text(_ARM_HARNESS)
    source = resources.files("autodice.runtime_cpp").joinpath(frame_copy.SOURCE)
    subprocess.run(["aarch64-linux-gnu-gcc", "-O3", "-Wall", "-Wextra", "-Werror", "-static",
                    "-o", str(tmp_path / "t"), str(tmp_path / "main.c"), str(source)], check=True)
    got = subprocess.run([str(QEMU), str(tmp_path / "t")], capture_output=True, text=True)
    assert (got.returncode, got.stdout) == (0, "fails 0\n")


def test_without_a_compiler_frames_are_copied_by_numpy(built, tmp_path, monkeypatch):
    """No C compiler: the helper says why, and a session still refuses a NaN frame and serves the
    others (numpy copies them)."""
    monkeypatch.setenv("CC", str(tmp_path / "no-cc"))
    monkeypatch.setenv("AUTODICE_CACHE", str(tmp_path / "cache"))
    frame_copy._helper.cache_clear()
    try:
        assert "no C compiler" in frame_copy.prepare()
        good = frames(2, seed=5)
        nan = good[0].copy()
        nan[0, 3, 7, 7] = np.inf
        with autodice.open(built / "out") as s:
            got = list(s.map([good[0], nan, good[1]]))
            assert s.stats()["frames_via"] == "shared memory"
        assert isinstance(got[1], FrameError) and got[1].index == 1
        for g, w in zip([got[0], got[2]], reference(built / "model.onnx", good)):
            assert np.abs(g - w).max() <= 1e-5 * np.abs(w).max()
    finally:
        frame_copy._helper.cache_clear()


def test_a_replay_cut_short_by_another_restart_keeps_the_feeder_waiting(built):
    """A job that dies while frames are sent to it again is restarted once more; the first
    replay's end must not let the feeder into the third job's slots beside its own replay."""
    with autodice.open(built / "out") as s:
        first = s._pause()   # the job died: restarted, its replay under way
        second = s._pause()  # died again during that replay
        s._resume(first)     # the first replay ends (its sends failed)
        assert s._paused
        s._resume(second)
        assert not s._paused
        s._abandon()


def test_a_caller_that_stops_early_leaves_the_session_in_step(built):
    xs = frames(40, seed=2)
    want = reference(built / "model.onnx", xs)
    with autodice.open(built / "out", window=4) as s:
        for i, _ in enumerate(s.map(xs)):
            if i == 2:
                break
        again = list(s.map(xs[10:20]))
    assert len(again) == 10
    for g, w in zip(again, want[10:20]):
        assert np.abs(g - w).max() <= 1e-5 * np.abs(w).max()


def test_frames_that_raise_come_after_the_results_before_them(built):
    xs = frames(12, seed=7)
    want = reference(built / "model.onnx", xs)

    def flaky():
        for i, x in enumerate(xs):
            if i == 5:
                raise ValueError("frame 5 is unreadable")
            yield x

    got = []
    with autodice.open(built / "out", window=3) as s:
        with pytest.raises(ValueError, match="frame 5 is unreadable"):
            for y in s.map(flaky()):
                got.append(y)
        assert len(got) == 5
        again = list(s.map(xs[6:]))  # in step: the next stream's results are its own
    assert len(again) == len(xs) - 6
    for g, w in zip(got + again, want[:5] + want[6:]):
        assert np.abs(g - w).max() <= 1e-5 * np.abs(w).max()


def test_results_larger_than_the_socket_holds(tmp_path):
    """1 MiB results, six frames in flight: more than the socket holds at once, so the session
    must read results while frames still go out (a gateway blocked writing a result reads no
    frame)."""
    shutil.copy(SPECS / "figure2" / "platform.txt", tmp_path / "platform.txt")
    (tmp_path / "mapping.json").write_text(json.dumps({"edge01_arm1": ["Relu1"],
                                                       "edge01_arm2": ["Sigmoid1"]}))
    onnx.save(wide_chain(256), tmp_path / "model.onnx")
    out = tmp_path / "out"
    autodice.split(tmp_path / "model.onnx", tmp_path / "mapping.json", tmp_path / "platform.txt",
                   out)
    autodice.gen(out)
    autodice.build(out)
    rng = np.random.default_rng(8)
    xs = [rng.standard_normal((1, 4, 256, 256)).astype(np.float32) for _ in range(24)]

    def stuck(*_):  # end the job too: a stalled gateway would hold close() as well
        for pid in programs(out):
            os.kill(pid, signal.SIGKILL)
        raise TimeoutError("the stream stalled: frames and results waited on each other")

    old = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(60)
    try:
        with autodice.open(out, window=6) as s:
            got = list(s.map(xs))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert len(got) == 24
    for g, x in zip(got, xs):
        assert np.abs(g - 1 / (1 + np.exp(-np.maximum(x, 0)))).max() <= 1e-5


def test_a_forwarded_input_is_not_overwritten_by_a_later_frame(tmp_path):
    """Rank 0 reads the model input and forwards it to rank 1, which is twice as slow: rank 0
    runs ahead, and the buffer a frame's input was sent from must not take a later frame's
    input before rank 1 has it."""
    shutil.copy(SPECS / "figure2" / "platform.txt", tmp_path / "platform.txt")
    (tmp_path / "mapping.json").write_text(json.dumps({"edge01_arm1": ["Conv1"],
                                                       "edge01_arm2": ["Add1", "Conv2", "Conv3"]}))
    onnx.save(input_skip(), tmp_path / "model.onnx")
    out = tmp_path / "out"
    autodice.split(tmp_path / "model.onnx", tmp_path / "mapping.json", tmp_path / "platform.txt",
                   out)
    assert [e["kind"] for e in json.loads((out / "plan.json").read_text())["edges"]] == \
        ["input", "activation"]
    autodice.gen(out)
    autodice.build(out)
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((1, 16, 64, 64)).astype(np.float32) for _ in range(60)]
    want = reference(tmp_path / "model.onnx", xs)
    with autodice.open(out) as s:
        got = list(s.map(xs))
    bad = [i for i, (g, w) in enumerate(zip(got, want))
           if np.abs(g - w).max() > 1e-4 * np.abs(w).max()]
    assert len(got) == 60 and not bad, f"frames {bad} differ from onnxruntime"
    assert s.stats()["ranks"][0]["frames_from_slots"] == 60  # forwarded from its slot's copy


def test_a_rank_that_dies_ends_the_session_naming_it_and_what_arrived(built):
    out = built / "out"
    delivered = []
    with pytest.raises(SessionError) as err:
        with autodice.open(out, window=4) as s:
            victim = rank_pid(out, 2)

            def slow():
                for i, x in enumerate(frames(10_000, seed=3)):
                    if i == 50:
                        os.kill(victim, signal.SIGKILL)
                    yield x

            for i, _ in enumerate(s.map(slow())):
                delivered.append(i)
    e = err.value
    assert "rank 2 (edge01_arm3" in str(e) and "died" in str(e)
    assert e.delivered == (delivered[-1] if delivered else -1)
    assert 40 <= len(delivered) <= 60
    deadline = time.monotonic() + 20
    while programs(out) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not programs(out)


def test_ctrl_c_in_the_caller_stops_the_job(built):
    out = built / "out"
    with pytest.raises(KeyboardInterrupt):
        with autodice.open(out) as s:
            for i, _ in enumerate(s.map(frames(1000, seed=4))):
                if i == 5:
                    raise KeyboardInterrupt
    assert not programs(out)


def test_cli_streams_a_batch_a_folder_of_images_and_stdin(built, tmp_path):
    from PIL import Image

    out = built / "out"
    xs = np.stack([x[0] for x in frames(25, seed=5)])  # (25, 4, 8, 8): frames on the batch axis
    np.save(tmp_path / "batch.npy", xs)
    want = np.stack(reference(built / "model.onnx", [x[None] for x in xs]))
    r = CliRunner().invoke(main, ["run", str(out), "--input", str(tmp_path / "batch.npy"),
                                  "--results", str(tmp_path / "r1"), "--check"])
    assert r.exit_code == 0, r.output
    assert "25 frames" in r.output and "once the pipeline is full, latency p50" in r.output
    got = np.load(tmp_path / "r1" / "output.npy")
    assert got.shape == (25, *want.shape[1:])
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    stats = json.loads((tmp_path / "r1" / "stats.json").read_text())
    assert stats["frames"] == 25 and {"p50", "p90", "p99"} <= set(stats["latency_s"])

    # A 4-channel model is no RGB classifier: the recipe is stated, so it reads 4 channels
    # from an RGBA image (scale 1, no normalisation) and the broken file is that frame's error.
    images = tmp_path / "images"
    images.mkdir()
    rng = np.random.default_rng(6)
    for i in range(3):
        Image.fromarray((rng.random((8 + i, 9, 4)) * 255).astype(np.uint8), "RGBA").save(
            images / f"{i}.png")
    (images / "3.jpg").write_text("not an image")
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(f"class{i}" for i in range(want[0].size)))
    r = CliRunner().invoke(main, ["run", str(out), "--input", str(images), "--results",
                                  str(tmp_path / "r2"), "--labels", str(labels), "--top-k", "2",
                                  "--preprocess", "resize=1,scale=1,mean=0/0/0/0,std=1/1/1/1"])
    assert r.exit_code == 3, r.output  # some frames failed: the rest delivered
    assert "0.png: class" in r.output and "1 frames failed" in r.output
    status = json.loads((tmp_path / "r2" / "frames.json").read_text())
    assert [s["frame"] for s in status] == ["0.png", "1.png", "2.png", "3.jpg"]
    assert "cannot make a frame" in status[3]["error"] and "error" not in status[0]

    raw = xs[:4].tobytes()
    r = CliRunner().invoke(main, ["run", str(out), "--input", "-", "--results",
                                  str(tmp_path / "r3")], input=raw)
    assert r.exit_code == 0, r.output
    assert np.abs(np.load(tmp_path / "r3" / "output.npy") - want[:4]).max() <= \
        1e-5 * np.abs(want).max()


def test_cli_one_image_or_one_frame_takes_labels(built, tmp_path):
    """One image is a stream of one frame (its recipe applied); one .npy frame is classified
    too; a recipe for a source of no images is an error, not ignored."""
    from PIL import Image

    out = built / "out"
    x = frames(1, seed=7)[0]
    want = reference(built / "model.onnx", [x])[0].reshape(-1)
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(f"class{i}" for i in range(want.size)))
    np.save(tmp_path / "one.npy", x)
    r = CliRunner().invoke(main, ["run", str(out), "--input", str(tmp_path / "one.npy"),
                                  "--results", str(tmp_path / "r1"), "--labels", str(labels),
                                  "--top-k", "2", "--frames", "3"])
    assert r.exit_code == 0, r.output
    best = np.argsort(-want, kind="stable")[:2]
    assert f"one.npy: class{best[0]} ({want[best[0]]:.3g}), class{best[1]} " in r.output

    pixels = (np.random.default_rng(8).random((8, 8, 4)) * 255).astype(np.uint8)
    Image.fromarray(pixels, "RGBA").save(tmp_path / "one.png")
    r = CliRunner().invoke(main, ["run", str(out), "--input", str(tmp_path / "one.png"),
                                  "--results", str(tmp_path / "r2"), "--labels", str(labels),
                                  "--preprocess", "resize=1,scale=1,mean=0,std=1"])
    assert r.exit_code == 0, r.output
    frame = pixels.astype(np.float32).transpose(2, 0, 1)[None]
    scores = reference(built / "model.onnx", [frame])[0].reshape(-1)
    assert f"one.png: class{int(np.argmax(scores))} (" in r.output and "1 frames in" in r.output
    got = np.load(tmp_path / "r2" / "output.npy")
    assert np.abs(got.reshape(-1) - scores).max() <= 1e-5 * np.abs(scores).max()

    for source in (tmp_path / "one.npy", "-"):
        r = CliRunner().invoke(main, ["run", str(out), "--input", str(source),
                                      "--preprocess", "resize=1"], input=b"")
        assert r.exit_code == 2 and "holds no images" in r.output, r.output


def test_a_job_that_cannot_start_is_one_error(built, tmp_path):
    broken = tmp_path / "out"
    shutil.copytree(built / "out", broken, symlinks=True)
    (broken / "ncnn" / "edge01_arm2.ncnn.bin").write_bytes(b"")
    with pytest.raises(autodice.AutodiceError, match="cannot load .*edge01_arm2.ncnn.bin"):
        autodice.open(broken)
    assert not programs(broken)


def test_image_recipe_and_sources_say_what_is_wrong(tmp_path):
    from PIL import Image

    with pytest.raises(autodice.AutodiceError, match="keys are resize"):
        ImageRecipe.parse("size=3")
    with pytest.raises(autodice.AutodiceError, match="not a number"):
        ImageRecipe.parse("mean=a/b/c")
    for bad, says in (("std=0/1/1", "each of size 1e-06 to 1e+06"),
                      ("mean=nan", "each of size 0 to 1e+06"), ("scale=0", "from 1e-06 to 1e+09"),
                      ("resize=inf", "from 1 to 16"), ("resize=1000", "from 1 to 16"),
                      ("resize=0.5", "from 1 to 16"), ("mean=1/2/3/4/5", "one to four numbers"),
                      ("bgr=2", "bgr (0 or 1)")):
        with pytest.raises(autodice.AutodiceError, match=re.escape(says)):
            ImageRecipe.parse(bad)
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.png").touch()
    with pytest.raises(autodice.AutodiceError, match=re.escape("one per channel of the input (3)")):
        frames_from(str(tmp_path / "images"), (1, 3, 8, 8), np.float32,
                    ImageRecipe.parse("mean=1/2"))
    assert ImageRecipe.parse("std=0.5, bgr=True,mean=0") == ImageRecipe(std=(0.5,), bgr=True,
                                                                       mean=(0.0,))
    pixels = (np.random.default_rng(9).random((8, 8, 4)) * 255).astype(np.uint8)
    Image.fromarray(pixels, "RGBA").save(tmp_path / "rgba.png")
    plain = ImageRecipe(resize=1, scale=1, mean=(0,), std=(1,))
    for recipe, channels, want in ((plain, 4, pixels), (replace(plain, bgr=True), 4,
                                                        pixels[..., [2, 1, 0, 3]]),
                                   (replace(plain, bgr=True), 3, pixels[..., [2, 1, 0]])):
        got = recipe.apply(tmp_path / "rgba.png", (1, channels, 8, 8), np.float32)
        assert np.array_equal(got[0], want.transpose(2, 0, 1).astype(np.float32))
    with pytest.raises(ValueError, match="2 channels: an image gives 1"):
        plain.apply(tmp_path / "rgba.png", (1, 2, 8, 8), np.float32)
    np.save(tmp_path / "odd.npy", np.zeros((5, 3, 8, 8), np.float32))
    with pytest.raises(autodice.AutodiceError, match="neither one frame nor a batch"):
        frames_from(str(tmp_path / "odd.npy"), (1, 4, 8, 8), np.float32)
    (tmp_path / "empty").mkdir()
    with pytest.raises(autodice.AutodiceError, match="no images there"):
        frames_from(str(tmp_path / "empty"), (1, 3, 8, 8), np.float32)
    n, batch = frames_from(str(tmp_path / "odd.npy"), (1, 3, 8, 8), np.float32)
    assert n == 5 and [label for label, _ in batch] == ["0", "1", "2", "3", "4"]


def test_sessions_do_not_share_a_stream(built):
    with autodice.open(built / "out") as s:
        it = s.map(frames(5))
        next(it)
        with pytest.raises(autodice.AutodiceError, match="already streaming"):
            next(s.map(frames(1)))
        it.close()
        assert len(list(s.map(frames(3)))) == 3
    assert threading.active_count() < 10


def test_run_check_fails_when_the_outputs_differ(built, tmp_path):
    """`run --check` exits 1 with FAIL when a rank computes something else (a weight changed,
    its size kept), for one frame repeated and for a stream alike: `make demo`'s check can fail."""
    bad = tmp_path / "out"
    shutil.copytree(built / "out", bad, symlinks=True)
    shutil.copy(built / "model.onnx", tmp_path)  # what --check compares with
    weights = max((bad / "ncnn").glob("*.ncnn.bin"), key=lambda p: p.stat().st_size)
    data = bytearray(weights.read_bytes())
    tail = np.frombuffer(data, np.float32, 8, len(data) - 32) + np.arange(1, 9, dtype=np.float32)
    data[-32:] = tail.tobytes()  # the last layer's bias, unevenly: no softmax hides it
    weights.write_bytes(bytes(data))
    xs = frames(3, seed=11)
    np.save(tmp_path / "one.npy", xs[0])
    np.save(tmp_path / "batch.npy", np.concatenate(xs))
    for source in ("one.npy", "batch.npy"):
        r = CliRunner().invoke(main, ["run", str(bad), "--input", str(tmp_path / source),
                                      "--results", str(tmp_path / source[:-4]), "--check"])
        assert r.exit_code == 1 and "FAIL" in r.output, (source, r.output)
    r = CliRunner().invoke(main, ["run", str(built / "out"), "--input", str(tmp_path / "one.npy"),
                                  "--results", str(tmp_path / "good"), "--check"])
    assert r.exit_code == 0 and "FAIL" not in r.output and " ok" in r.output, r.output


def test_run_frame_by_frame_and_its_refusal_for_a_stream(built, tmp_path):
    """`--no-pipeline` runs one frame through every rank at a time (as the paper ran), equal to
    onnxruntime; a stream is always pipelined, so there it is an error, before anything runs."""
    xs = frames(2, seed=12)
    np.save(tmp_path / "one.npy", xs[0])
    np.save(tmp_path / "batch.npy", np.concatenate(xs))
    r = CliRunner().invoke(main, ["run", str(built / "out"), "--input", str(tmp_path / "one.npy"),
                                  "--results", str(tmp_path / "r"), "--frames", "3",
                                  "--no-pipeline", "--check"])
    assert r.exit_code == 0 and "(frame by frame)" in r.output and " ok" in r.output, r.output
    assert json.loads((tmp_path / "r" / "stats.json").read_text())["pipeline"] is False
    r = CliRunner().invoke(main, ["run", str(built / "out"), "--input",
                                  str(tmp_path / "batch.npy"), "--no-pipeline"])
    assert r.exit_code == 2 and "--no-pipeline: a stream is pipelined" in r.output, r.output


def test_the_gateway_does_not_count_a_frame_s_turn_in_the_queue_as_late(tmp_path,
                                                                          monkeypatch):
    """The watchdogs allow each stage AUTODICE_TIMEOUT_S (T), the gateway a frame's result
    (n + 1) T. Frames queued in the window behind others are no stage's fault: the gateway
    counted their whole wait against the frame (64 queued frames of a 0.1 s stage is 6.4 s)
    and ended healthy jobs on slow boards. Late now counts from the result before."""
    heavy = conv_chain(4, channels=64, side=128)  # rank 0's stage; then tiny ones
    g = heavy.graph
    g.node[-1].output[0] = "Buff4"
    tiny = [f"Relu{k}" for k in range(1, 5)]  # four tiny stages
    g.node.extend([helper.make_node("GlobalAveragePool", ["Buff4"], ["Buff5"], name="Pool"),
                   *(helper.make_node("Relu", [f"Buff{k + 4}"],
                                      [f"Buff{k + 5}" if k < 4 else "output"], name=f"Relu{k}")
                     for k in range(1, 5))])
    g.output[0].type.tensor_type.shape.dim[2].dim_value = 1
    g.output[0].type.tensor_type.shape.dim[3].dim_value = 1
    onnx.save(heavy, tmp_path / "m.onnx")
    (tmp_path / "platform.txt").write_text("".join(f"edge0{h}, x86, slots=0-1\n"
                                                   for h in (1, 2, 3)))
    keys = ["edge01_x861", "edge02_x860", "edge02_x861", "edge03_x860"]
    (tmp_path / "mapping.json").write_text(json.dumps(
        {"edge01_x860": ["Conv1", "Conv2", "Conv3", "Conv4", "Pool"],
         **{k: [layer] for k, layer in zip(keys, tiny)}}))
    out = tmp_path / "out"
    autodice.split(tmp_path / "m.onnx", tmp_path / "mapping.json", tmp_path / "platform.txt", out)
    autodice.gen(out)
    autodice.build(out)
    xs = [np.random.default_rng(k).standard_normal((1, 64, 128, 128)).astype(np.float32)
          for k in range(3)]
    want = reference(tmp_path / "m.onnx", xs)
    np.save(tmp_path / "x.npy", xs[0])
    st = autodice.run(out, {"input": tmp_path / "x.npy"}, frames=4, pipeline=False).stats
    stage_s = st["ranks"][0]["compute_s"] / st["frames"]  # rank 0's convolutions, a frame
    assert stage_s > 20 * max(r["compute_s"] for r in st["ranks"][1:]) / st["frames"]

    # A full window of 64 frames: each result comes a stage after the last, within T = 8
    # stages (4 left rank 1 waiting past T once on the shared VM); the last frame came 64
    # stages before its result (the gateway allowed 6 T, 48 stages).
    monkeypatch.setenv("AUTODICE_TIMEOUT_S", f"{8 * stage_s:.3f}")
    with autodice.open(out, window=64) as s:
        got = list(s.map([xs[k % 3] for k in range(64)]))
    assert len(got) == 64
    for k, y in enumerate(got):
        assert np.abs(y - want[k % 3]).max() <= 1e-4 * np.abs(want[k % 3]).max()
