"""Stopped means stopped, failed means failed: signals, bombs, bad frames, hostile names and
misuse of the API on the run and session paths, each against a real job (Figure 2 with all
three kinds of parallelism, ``fig2_built``).

The rules under test (docs/running.md, "Exit codes and signals"): a job never outlives the
autodice process that started it, however that ends (SIGKILL included: within 2 s, its shared
memory released); SIGINT/SIGTERM/SIGHUP stop a stream cleanly (what was delivered is written,
cut to it, with exit 128 + the signal); input refused up front exits 2 before any job starts; a
stream whose frames failed, some or all, exits 3; no result file is ever half-written; the
caller's own errors stay the caller's; every name printed is escaped. ``test_probe.py`` sweeps a
hundred more cases over the same rules.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import shm_entries
from test_session import frames, programs, reference

import autodice
from autodice.backend.session import SessionError
from autodice.backend.session.frames import ImageRecipe

pytestmark = pytest.mark.cpp


def shm() -> set[str]:
    """Shared memory held: the files under /dev/shm (a job's folder left empty holds none), the
    other test worker's jobs aside."""
    return {str(f) for p in shm_entries() for f in (p.rglob("*") if p.is_dir() else [p])
            if f.is_file()}


def cli(*args: str, **options) -> subprocess.Popen:
    """``autodice ARGS`` in a process of its own (signals are delivered to it, not to pytest)."""
    return subprocess.Popen([sys.executable, "-m", "autodice", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **options)


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.05)


def jobs_of(out: Path) -> list[int]:
    """The job's processes: its ranks, and mpirun (its command line names the program)."""
    exe = str((out / "build" / "local" / "program").resolve())
    found = programs(out)
    for p in Path("/proc").iterdir():
        try:
            cmd = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if p.name.isdigit() and b"prterun" in cmd[0] and exe.encode() in cmd:
            found.append(int(p.name))
    return found


def gone_within(out: Path, seconds: float, shm_before: set[str]) -> None:
    """Nothing of ``out``'s job runs (zombies aside) and no shared memory of it is left."""
    def running() -> list[int]:
        alive = []
        for pid in jobs_of(out):
            try:
                if Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z":
                    alive.append(pid)
            except OSError:
                pass
        return alive

    wait_for(lambda: not running() and not (shm() - shm_before), seconds,
             "end of the job and of its shared memory")


@pytest.fixture
def big_batch(tmp_path):
    """50,000 frames of Figure 2 (51 MB): a stream of many seconds."""
    path = tmp_path / "big.npy"
    xs = np.lib.format.open_memmap(path, "w+", np.float32, (50_000, 1, 4, 8, 8))
    xs[:] = np.random.default_rng(1).standard_normal((1, 1, 4, 8, 8), np.float32)
    xs[::7] *= 2
    xs.flush()
    return path


@pytest.mark.parametrize("path", ["repeat", "stream"])
def test_sigkill_of_the_cli_ends_its_job_within_2_s(fig2_built, big_batch, tmp_path, path):
    """SIGKILL runs no code of ours: the kernel's parent-death signal ends mpirun, which ends
    every rank and removes their shared memory."""
    out = fig2_built / "out"
    x = tmp_path / "x.npy"
    np.save(x, frames(1)[0])
    before = shm()
    source = [str(x), "--frames", "100000000"] if path == "repeat" else [str(big_batch)]
    proc = cli("run", str(out), "--input", *source, "--results", str(tmp_path / "r"))
    wait_for(lambda: len(programs(out)) >= 4, 60, "job")  # 4 ranks (and a stream's gateway)
    if path == "stream":
        wait_for(lambda: (tmp_path / "r" / ".output.npy.partial").exists(), 60, "first result")
    time.sleep(0.5)
    proc.kill()
    proc.wait()
    gone_within(out, 2.0, before)
    if path == "stream":  # nothing under a result's name: it was never whole
        left = {p.name for p in (tmp_path / "r").iterdir()}
        assert not left & {"output.npy", "frames.json", "stats.json"}, left


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130),
                                       (signal.SIGHUP, 129)])
def test_a_signal_mid_stream_writes_what_was_delivered(fig2_built, big_batch, tmp_path, sig, code):
    out, results = fig2_built / "out", tmp_path / "r"
    before = shm()
    proc = cli("run", str(out), "--input", str(big_batch), "--results", str(results))
    wait_for(lambda: (results / ".output.npy.partial").exists(), 60, "first result")
    time.sleep(1.0)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert f"stopped by {sig.name}" in err and "Traceback" not in err
    status = json.loads((results / "frames.json").read_text())
    stats = json.loads((results / "stats.json").read_text())
    got = np.load(results / "output.npy")
    assert 0 < len(status) == len(got) == stats["frames"] < 50_000
    assert stats["interrupted"] == sig.name and stats["ranks"]  # the job ended in order
    xs = np.load(big_batch, mmap_mode="r")
    for i in (0, 7, len(got) - 1):  # cut to the frames delivered, each its own
        want = reference(fig2_built / "model.onnx", [np.array(xs[i])])[0]
        assert np.abs(got[i] - want[0]).max() <= 1e-5 * np.abs(want).max(), i
    assert not list(results.glob(".*partial*"))
    gone_within(out, 2.0, before)
    assert not list(Path(os.environ["TMPDIR"]).glob(f"autodice-session-{proc.pid}-*"))


def test_sigterm_of_a_repeated_run_leaves_no_outputs_claiming_it(fig2_built, tmp_path):
    out, results = fig2_built / "out", tmp_path / "r"
    np.save(tmp_path / "x.npy", frames(1)[0])
    assert autodice.run(out, {"input": tmp_path / "x.npy"}, frames=3).outputs
    results.mkdir()
    (results / "output.npy").write_bytes((out / "results" / "output.npy").read_bytes())
    proc = cli("run", str(out), "--input", str(tmp_path / "x.npy"), "--frames", "100000000",
               "--results", str(results))
    wait_for(lambda: len(programs(out)) == 4, 60, "job")
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143 and "stopped by SIGTERM" in err, err
    assert not (results / "output.npy").exists() and not (results / "stats.json").exists()
    assert not programs(out)


def test_sigkill_mid_stream_then_the_next_run_sweeps_the_partial_files(fig2_built, big_batch,
                                                                       tmp_path):
    out, results = fig2_built / "out", tmp_path / "r"
    proc = cli("run", str(out), "--input", str(big_batch), "--results", str(results))
    wait_for(lambda: (results / ".output.npy.partial").exists(), 60, "first result")
    proc.kill()
    proc.wait()
    np.save(tmp_path / "few.npy", np.stack(frames(5)))
    done = cli("run", str(out), "--input", str(tmp_path / "few.npy"), "--results", str(results))
    _, err = done.communicate(timeout=120)
    assert done.returncode == 0, err
    assert sorted(p.name for p in results.iterdir() if p.name != "job.log") == [
        "frames.json", "output.npy", "stats.json"]
    assert np.load(results / "output.npy").shape[0] == 5


@pytest.mark.parametrize("error", [FileNotFoundError(2, "No such file or directory", "cat.jpg"),
                                   ValueError("a camera said no")])
def test_an_error_of_the_callers_frames_is_raised_as_itself(fig2_built, error):
    """The session takes only its own socket's errors for the gateway's end: an OSError from
    the caller's iterator (a missing image) once stopped a healthy job."""
    xs = frames(30, seed=2)

    def camera():
        yield from xs[:20]
        raise error

    with autodice.open(fig2_built / "out") as s:
        with pytest.raises(type(error)) as caught:
            for _ in s.map(camera()):
                pass
        assert caught.value is error
        assert any(t.name == "camera" for t in caught.traceback)  # where the caller raised it
        want = reference(fig2_built / "model.onnx", xs[20:])
        got = list(s.map(iter(xs[20:])))  # the session is in step and serving
        assert all(np.abs(g - w).max() <= 1e-5 * np.abs(w).max() for g, w in zip(got, want))
        assert np.array_equal(s.infer(xs[3]), s.infer(xs[3]))
    assert s.stats()["frames"] == 20 + 10 + 2


def test_a_dead_job_names_its_rank_without_open_mpis_notices(fig2_built):
    with pytest.raises(SessionError) as caught:
        with autodice.open(fig2_built / "out") as s:
            for i, _ in enumerate(s.map(iter(frames(2000)))):
                if i == 10:
                    pid = programs(fig2_built / "out")[0]
                    os.kill(pid, signal.SIGKILL)
    text = "\n".join(caught.value.problems)
    assert "died: killed by signal 9" in text and "deprecated" not in text.lower(), text
    assert isinstance(caught.value, autodice.AutodiceError)
    log = Path(caught.value.problems[-2].removeprefix("log: "))
    assert log.is_file() and log.parent.name == "logs"  # the log outlives the session's folder
    assert not list(Path(os.environ["TMPDIR"]).glob(f"autodice-session-{os.getpid()}-*"))
    # rank 0 died before it could remove its shared memory: the job's folder went with the job
    assert not list(Path("/dev/shm").glob(f"autodice-job-{os.getpid()}-*"))


def test_stale_session_folders_of_dead_processes_are_swept(fig2_built, tmp_path):
    tmp = Path(os.environ["TMPDIR"])
    dead = next(p for p in range(4_000_000, 4_100_000) if not Path(f"/proc/{p}").exists())
    stale, live = tmp / f"autodice-session-{dead}-x1", tmp / f"autodice-session-{os.getppid()}-y"
    for folder in (stale, live):
        folder.mkdir()
        (folder / "job.log").write_text("old")
    with autodice.open(fig2_built / "out") as s:
        s.infer(frames(1)[0])
    assert not stale.exists() and live.exists()


def png(width: int, height: int, data: bytes | None = None) -> bytes:
    """A grey PNG of that size; ``data`` None: rows of zeros (a few bytes compressed)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(
            ">I", zlib.crc32(kind + body))

    raw = data if data is not None else b"".join(b"\0" + bytes(width) for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0,
                                                               0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def test_aspect_ratio_bombs_make_frames_in_bounded_memory(tmp_path):
    """A 254-byte 60000x1 PNG once asked the resize for 15,360,000x256 pixels (15.7 GB)."""
    for w, h in ((60000, 1), (5000, 1), (1, 60000)):
        (tmp_path / f"{w}x{h}.png").write_bytes(png(w, h))
    script = ("import sys, numpy as np\n"
              "from pathlib import Path\n"
              "from autodice.backend.session.frames import ImageRecipe\n"
              "for p in sorted(Path(sys.argv[1]).glob('*.png')):\n"
              "    a = ImageRecipe(resize=16).apply(p, (1, 3, 256, 256), np.float32)\n"
              "    assert a.shape == (1, 3, 256, 256) and np.isfinite(a).all()\n"
              "hwm = open('/proc/self/status').read().split('VmHWM:')[1].split()[0]\n"
              "print(int(hwm) // 1024)\n")  # (ru_maxrss holds the forking parent's peak)
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) < 400, f"peak RSS {r.stdout.strip()} MB"


def test_an_image_past_the_pixel_limit_is_refused_before_it_is_decoded(tmp_path):
    (tmp_path / "huge.png").write_bytes(png(20000, 6000, b"\0"))  # claims 120 Mpx, holds none
    with pytest.raises(ValueError, match="20000x6000 pixels, past the 100 million"):
        ImageRecipe().apply(tmp_path / "huge.png", (1, 3, 224, 224), np.float32)


class _CountedThenStopped:
    """A session that counts a frame as handed over and is stopped before the stream takes it:
    the gap a signal can fall into between the session's count and the stream's record."""

    inputs = outputs = [SimpleNamespace(name="y", shape=(1, 2), dtype=np.float32)]

    def __init__(self, stop_at: int):
        self.stop_at, self.counted = stop_at, 0

    def map(self, frames):
        for i, _ in enumerate(frames):
            self.counted += 1
            if i == self.stop_at:
                raise KeyboardInterrupt  # after the count, before the yield
            yield np.full((1, 2), i, np.float32)

    def note_dropped(self, dropped):
        pass

    def close(self):
        pass

    def stats(self):
        return {"frames": self.counted}


def test_stats_speak_of_the_frames_written_when_a_stop_falls_after_the_count(tmp_path):
    from autodice.backend.session.results import finish, stream

    plan = SimpleNamespace(model_inputs=[], model_outputs=_CountedThenStopped.outputs)
    session = _CountedThenStopped(stop_at=3)
    frames = ((str(i), np.zeros((1, 2), np.float32)) for i in range(10))
    res = finish(session, stream(session, plan, frames, None, tmp_path))
    assert res.interrupted == "SIGINT" and res.delivered == 3 and session.counted == 4
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["frames"] == 3 == len(np.load(tmp_path / "y.npy"))
