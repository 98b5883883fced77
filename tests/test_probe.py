"""A probe of the run, stream and API paths: over a hundred hostile cases, each against the real
job of ``fig2_built`` (Figure 2 with all three kinds of parallelism, input 1x4x8x8 float32,
output 1x4x4x4), each held to the same rules (docs/running.md, "Exit codes and signals"):

- no traceback, ever; the exit code the case deserves (2: refused before any job started, and
  then no results folder; 3: some or all frames failed, the rest delivered; 0 otherwise), and a
  line that names the culprit;
- nothing left behind: no process of the job, no session folder of ours;
- a results folder that holds whole files that agree (one row per frame in each);
- nothing of a name printed raw (``\\x1b`` and newlines are spelled out).

The signals, bombs and the caller's own errors are ``test_faults.py``'s.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image
from test_faults import png
from test_session import frames, programs

import autodice
from autodice.backend.session import FrameError
from autodice.cli import main

pytestmark = pytest.mark.cpp

F = frames(1)[0]
BAD_BYTES = b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (1, 4,"


def _npy_header(shape, descr="<f4") -> bytes:
    import io

    f = io.BytesIO()
    np.lib.format.write_array_header_1_0(f, {"descr": descr, "fortran_order": False,
                                             "shape": shape})
    return f.getvalue()


def _rgba(path: Path, seed: int) -> None:
    pixels = (np.random.default_rng(seed).random((9, 10, 4)) * 255).astype(np.uint8)
    Image.fromarray(pixels, "RGBA").save(path)


@pytest.fixture(scope="module")
def d(tmp_path_factory, fig2_built):
    """Every file the cases use, made once."""
    d = tmp_path_factory.mktemp("probe")
    batch = np.stack(frames(6, seed=4))
    files = {
        "ok.npy": F, "batch.npy": batch, "f64.npy": F.astype(np.float64),
        "f64batch.npy": batch.astype(np.float64), "i32batch.npy": batch.astype(np.int32),
        "wrong.npy": F[:, :3], "wrongbatch.npy": batch[:, :, :3], "scalar.npy": np.float32(1),
        "zerobatch.npy": batch[:0], "nan1.npy": np.where(F > 1, np.nan, F).astype(np.float32),
        "inf1.npy": np.where(F > 1, -np.inf, F).astype(np.float32),
    }
    for name, a in files.items():
        np.save(d / name, a)
    with_nan = batch.copy()
    with_nan[2, 0, 0, 0, 0] = np.nan
    with_nan[4, 0, 1, 1, 1] = np.inf
    np.save(d / "batch_nan.npy", with_nan)
    (d / "empty.npy").touch()
    (d / "headeronly.npy").write_bytes(_npy_header((1, 4, 8, 8)))
    (d / "huge.npy").write_bytes(_npy_header((400000, 400000)) + bytes(16))
    (d / "truncated.npy").write_bytes(_npy_header((1, 4, 8, 8)) + bytes(500))
    (d / "object.npy").write_bytes(_npy_header((2,), "|O") + bytes(16))
    (d / "text.npy").write_text("not numpy at all")
    (d / "badhead.npy").write_bytes(BAD_BYTES)
    for folder in ("imgs_ok", "imgs_bad", "imgs_mixed", "imgs_none", "imgs_hostile"):
        (d / folder).mkdir()
    for i in range(3):
        _rgba(d / "imgs_ok" / f"{i}.png", i)
    (d / "imgs_bad" / "text.jpg").write_text("not an image")
    (d / "imgs_bad" / "empty.png").touch()
    (d / "imgs_bad" / "cut.png").write_bytes((d / "imgs_ok" / "0.png").read_bytes()[:60])
    _rgba(d / "imgs_mixed" / "a.png", 7)
    (d / "imgs_mixed" / "b.png").write_bytes(png(20000, 6000, b"\0"))  # 120 Mpx claimed
    _rgba(d / "imgs_mixed" / "c.png", 8)
    (d / "imgs_hostile" / "a\x1b[2Jb.png").write_text("clears the screen")
    (d / "imgs_hostile" / "c\nerror: forged.png").write_text("forges a line")
    _rgba(d / "imgs_hostile" / "ok\x07.png", 9)
    (d / "wide.png").write_bytes(png(60000, 1))
    (d / "labels.txt").write_text("\n".join(f"class{i}" for i in range(64)))
    (d / "labels_esc.txt").write_text("\n".join(f"c\x1b[31m{i}" for i in range(64)))
    (d / "labels_ten.txt").write_text("\n".join(f"class{i}" for i in range(10)))
    (d / "labels_latin1.txt").write_bytes("caf\xe9\n".encode("latin-1") * 64)
    (d / "a_file").write_text("x")
    out = fig2_built / "out"
    unbuilt = d / "unbuilt"
    shutil.copytree(out, unbuilt, ignore=shutil.ignore_patterns("build", "packages", "results"))
    shutil.copy(fig2_built / "model.onnx", d / "model.onnx")  # what plan.json names
    swapped = d / "swapped"
    shutil.copytree(out, swapped, ignore=shutil.ignore_patterns("build", "results"))
    plan = json.loads((swapped / "plan.json").read_text())
    plan["ranks"][0]["submodel"], plan["ranks"][1]["submodel"] = (plan["ranks"][1]["submodel"],
                                                                  plan["ranks"][0]["submodel"])
    (swapped / "plan.json").write_text(json.dumps(plan))
    brokenplan = d / "brokenplan"
    shutil.copytree(out, brokenplan, ignore=shutil.ignore_patterns("build", "results"))
    (brokenplan / "plan.json").write_text('{"version": 1, "ranks": [')
    return d


R = "--results {r}"
P = "--preprocess mean=0,std=1 "  # Figure 2 takes 4 channels: RGBA, not ImageNet's RGB
# (id, arguments after `autodice`, stdin, exit code, what the output says)
CLI = [
    ("one frame", "run {out} --input {d}/ok.npy " + R, None, 0, "1 frames"),
    ("batch", "run {out} --input {d}/batch.npy " + R, None, 0, "6 frames"),
    ("batch of NaN and inf frames", "run {out} --input {d}/batch_nan.npy " + R, None, 3,
     "frame 2: input \"input\" holds NaN"),
    ("one NaN frame", "run {out} --input {d}/nan1.npy " + R, None, 2, "holds NaN or infinite"),
    ("one -inf frame", "run {out} --input {d}/inf1.npy " + R, None, 2, "holds NaN or infinite"),
    ("float64 frame", "run {out} --input {d}/f64.npy " + R, None, 2, "got 1x4x8x8 float64"),
    ("float64 batch", "run {out} --input {d}/f64batch.npy " + R, None, 2, "are float64"),
    ("int32 batch", "run {out} --input {d}/i32batch.npy " + R, None, 2, "are int32"),
    ("wrong frame shape", "run {out} --input {d}/wrong.npy " + R, None, 2, "must be 1x4x8x8"),
    ("wrong batch shape", "run {out} --input {d}/wrongbatch.npy " + R, None, 2, "must be 1x4x8x8"),
    ("scalar", "run {out} --input {d}/scalar.npy " + R, None, 2, "must be 1x4x8x8"),
    ("batch of none", "run {out} --input {d}/zerobatch.npy " + R, None, 2, "a batch of no frames"),
    ("0-byte npy", "run {out} --input {d}/empty.npy " + R, None, 2, "no .npy header"),
    ("header only", "run {out} --input {d}/headeronly.npy " + R, None, 2,
     "shorter than its header"),
    ("596 GiB header", "run {out} --input {d}/huge.npy " + R, None, 2, "shorter than its header"),
    ("truncated npy", "run {out} --input {d}/truncated.npy " + R, None, 2, "shorter than"),
    ("object npy", "run {out} --input {d}/object.npy " + R, None, 2, "not a .npy array"),
    ("text as npy", "run {out} --input {d}/text.npy " + R, None, 2, "no .npy header"),
    ("bad npy header", "run {out} --input {d}/badhead.npy " + R, None, 2, "not a .npy array"),
    ("missing npy", "run {out} --input {d}/nope.npy " + R, None, 2, "cannot read it"),
    ("missing image", "run {out} --input {d}/nope.png " + R, None, 2, "no such image"),
    ("images", "run {out} --input {d}/imgs_ok " + P + R, None, 0, "3 frames"),
    ("every image bad", "run {out} --input {d}/imgs_bad " + P + R, None, 3,
     "cannot make a frame"),
    ("a pixel bomb among images", "run {out} --input {d}/imgs_mixed " + P + R, None, 3,
     "20000x6000 pixels, past the 100 million"),
    ("no images", "run {out} --input {d}/imgs_none " + R, None, 2, "no images there"),
    ("hostile file names", "run {out} --input {d}/imgs_hostile " + P + R, None, 3,
     "a\\x1b[2Jb.png"),
    ("aspect-ratio bomb", "run {out} --input {d}/wide.png " + P + R, None, 0, "1 frames"),
    ("labels", "run {out} --input {d}/imgs_ok --labels {d}/labels.txt " + P + R, None, 0,
     "0.png: class"),
    ("labels with escapes", "run {out} --input {d}/batch.npy --labels {d}/labels_esc.txt " + R,
     None, 0, "c\\x1b[31m"),
    ("labels for another model", "run {out} --input {d}/batch.npy --labels {d}/labels_ten.txt "
     + R, None, 2, "10 labels, but the model's output"),
    ("labels not UTF-8", "run {out} --input {d}/batch.npy --labels {d}/labels_latin1.txt " + R,
     None, 2, "not UTF-8 text"),
    ("labels missing", "run {out} --input {d}/batch.npy --labels {d}/nope.txt " + R, None, 2,
     "cannot read"),
    ("labels of one frame, another model", "run {out} --input {d}/ok.npy --labels "
     "{d}/labels_ten.txt " + R, None, 2, "10 labels"),
    ("--frames 0", "run {out} --input {d}/ok.npy --frames 0 " + R, None, 2, "at least 1"),
    ("--frames -1 stream", "run {out} --input {d}/batch.npy --frames -1 " + R, None, 2,
     "at least 1"),
    ("--frames x", "run {out} --input {d}/ok.npy --frames x " + R, None, 2, "not a valid integer"),
    ("--frames caps a stream", "run {out} --input {d}/batch.npy --frames 2 " + R, None, 0,
     "2 frames"),
    ("--window 0", "run {out} --input {d}/batch.npy --window 0 " + R, None, 2, "at least 1"),
    ("--window -3", "run {out} --input {d}/batch.npy --window -3 " + R, None, 2, "at least 1"),
    ("--window x", "run {out} --input {d}/batch.npy --window x " + R, None, 2, "not a valid"),
    ("--window 1", "run {out} --input {d}/batch.npy --window 1 " + R, None, 0, "6 frames"),
    ("--top-k 0", "run {out} --input {d}/batch.npy --labels {d}/labels.txt --top-k 0 " + R, None,
     2, "--top-k"),
    ("--rtol nan", "run {out} --input {d}/ok.npy --check --rtol nan " + R, None, 2,
     "finite number above 0"),
    ("--rtol -1", "run {out} --input {d}/ok.npy --check --rtol -1 " + R, None, 2, "above 0"),
    ("--results is a file", "run {out} --input {d}/ok.npy --results {d}/a_file", None, 2,
     "a_file"),
    ("--no-pipeline stream", "run {out} --input {d}/batch.npy --no-pipeline " + R, None, 2,
     "a stream is pipelined"),
    ("--preprocess on npy", "run {out} --input {d}/batch.npy --preprocess scale=1 " + R, None, 2,
     "holds no images"),
    ("--preprocess on one npy", "run {out} --input {d}/ok.npy --preprocess scale=1 " + R, None,
     2, "holds no images"),
    *[(f"--preprocess {p}", f"run {{out}} --input {{d}}/imgs_ok --preprocess {p} " + R, None, 2,
       says) for p, says in (
        ("resize=0", "from 1 to 16"), ("resize=17", "from 1 to 16"), ("resize=1000", "1 to 16"),
        ("resize=nan", "from 1 to 16"), ("scale=-1", "from 1e-06"), ("scale=inf", "1e+09"),
        ("mean=a/b", "not a number"), ("mean=nan", "each of size"), ("std=0", "each of size"),
        ("std=1/1/1/1/1", "one to four"), ("layout=xyz", "keys are"), ("bgr=maybe", "keys are"),
        ("foo=1", "keys are"), ("=", "keys are"), ("resize", "not a number"),
        ("mean=1/2", "one per channel"))],
    ("--preprocess good", "run {out} --input {d}/imgs_ok --preprocess "
     "resize=1,scale=1,mean=0,std=1,bgr=1 " + R, None, 0, "3 frames"),
    ("unknown input name", "run {out} --input nope={d}/ok.npy " + R, None, 2,
     "name one of the model inputs"),
    ("input twice", "run {out} --input input={d}/ok.npy --input input={d}/ok.npy " + R, None, 2,
     "given twice"),
    ("no such output", "run {d}/nothing --input {d}/ok.npy " + R, None, 2, "plan.json"),
    ("not built", "run {d}/unbuilt --input {d}/ok.npy " + R, None, 2, "not built"),
    ("not built, stream", "run {d}/unbuilt --input {d}/batch.npy " + R, None, 2, "not built"),
    ("broken plan.json", "run {d}/brokenplan --input {d}/ok.npy " + R, None, 2, "plan.json"),
    ("plan.json names other models", "check {d}/swapped", None, 2,
     "not rank 0's sub-model as plan.json says"),
    ("stdin", "run {out} --input - " + R, np.stack(frames(3)).tobytes(), 0, "3 frames"),
    ("stdin cut mid-frame", "run {out} --input - " + R, F.tobytes() * 2 + b"\0" * 100, 3,
     "stdin ended 100 bytes into a frame"),
    ("stdin of NaN", "run {out} --input - " + R, np.full(256 * 3, np.nan, np.float32).tobytes(),
     3, "holds NaN"),
    ("stdin of noise", "run {out} --input - " + R,
     np.random.default_rng(0).bytes(1024 * 8), 3, "holds NaN"),
    ("--check stream", "run {out} --input {d}/batch.npy --check " + R, None, 0, "ok"),
    ("layers of a hostile name", "layers {d}/hostile.onnx", None, 0, "Conv\\x1b[2J"),
]


def _run(case_args: str, stdin, d: Path, out: Path, r: Path):
    args = [a.format(d=d, out=out, r=r) for a in case_args.split()]
    return CliRunner().invoke(main, args, input=stdin)


@pytest.fixture(scope="module")
def hostile_model(d):
    from graphs import figure2

    m = figure2()
    m.graph.node[1].name = "Conv\x1b[2J\nerror: forged"
    import onnx

    onnx.save(m, d / "hostile.onnx")


@pytest.mark.parametrize("name, args, stdin, code, says", CLI, ids=[c[0] for c in CLI])
def test_cli(name, args, stdin, code, says, d, fig2_built, hostile_model, tmp_path):
    out = fig2_built / "out"
    r = tmp_path / "r"
    mine = set(Path(os.environ["TMPDIR"]).glob(f"autodice-session-{os.getpid()}-*"))
    result = _run(args, stdin, d, out, r)
    text = result.output
    assert "Traceback" not in text and result.exception is None or \
        isinstance(result.exception, SystemExit), text
    assert result.exit_code == code, text
    assert says in text, text
    assert "\x1b" not in text and not any(ln.startswith("error: forged") for ln in
                                          text.splitlines()), text
    assert not programs(out)
    assert set(Path(os.environ["TMPDIR"]).glob(f"autodice-session-{os.getpid()}-*")) == mine
    if code == 2:
        assert not r.exists() or not any(r.iterdir()), "refused, yet wrote results"
    elif args.startswith("run") and r.exists() and (r / "frames.json").exists():
        status = json.loads((r / "frames.json").read_text())
        stats = json.loads((r / "stats.json").read_text())
        assert len(np.load(r / "output.npy")) == len(status)
        assert sum("error" in s for s in status) == (0 if code == 0 else len(status) -
                                                     stats["frames"])
        assert not list(r.glob(".*partial*"))


def _api_cases(d: Path, out: Path):
    """(id, what to call, the exception it must raise, what its message says)."""
    x = frames(1)[0]
    return [
        ("open window='3'", lambda: autodice.open(out, window="3"), "window '3'"),
        ("open window=2.5", lambda: autodice.open(out, window=2.5), "window 2.5"),
        ("open window=0", lambda: autodice.open(out, window=0), "at least 1"),
        ("open window=True", lambda: autodice.open(out, window=True), "window True"),
        ("open window=-1", lambda: autodice.open(out, window=-1), "at least 1"),
        ("open recover without inventory", lambda: autodice.open(out, recover=True),
         "recover needs an inventory"),
        ("open a folder of no plan", lambda: autodice.open(d / "nothing"), "plan.json"),
        ("open unbuilt", lambda: autodice.open(d / "unbuilt"), "not built"),
        ("run frames='3'", lambda: autodice.run(out, {"input": d / "ok.npy"}, frames="3"),
         "frames '3'"),
        ("run frames=0", lambda: autodice.run(out, {"input": d / "ok.npy"}, frames=0),
         "at least 1"),
        ("run frames=2.0", lambda: autodice.run(out, {"input": d / "ok.npy"}, frames=2.0),
         "whole number"),
        ("run inputs as a list", lambda: autodice.run(out, [d / "ok.npy"]), "a dict"),
        ("run inputs of numbers", lambda: autodice.run(out, {"input": 3}), "a dict"),
        ("run a NaN frame", lambda: autodice.run(out, {"input": d / "nan1.npy"}), "NaN"),
        ("run an unknown input", lambda: autodice.run(out, {"nope": d / "ok.npy"}),
         'no input given for model input "input"'),
        ("run a huge header", lambda: autodice.run(out, {"input": d / "huge.npy"}),
         "shorter than its header"),
        ("deploy frames=0", lambda: autodice.api.deploy(out, d / "inv.toml", frames=0),
         "at least 1"),
        ("check samples=0", lambda: autodice.check(out, samples=0), "at least 1"),
        ("check swapped sub-models", lambda: autodice.check(d / "swapped"), "not rank 0's"),
    ] + [(f"infer {what}", frame, "FrameError") for what, frame in (
        ("None", None), ("a string", "nope.jpg"), ("wrong shape", x[:, :3]),
        ("float64", x.astype(np.float64)), ("NaN", np.full_like(x, np.nan)),
        ("+inf", np.full_like(x, np.inf)), ("an unknown name", {"nope": x}), ("no input", {}),
        ("an object", object()), ("a list of lists", [[1.0]]))]


def test_api(d, fig2_built):
    out = fig2_built / "out"
    cases = _api_cases(d, out)
    x = frames(1)[0]
    assert len(CLI) + len(cases) + 8 >= 100  # the probe's size, with the session's cases below
    for name, call, says in cases:
        if says == "FrameError":
            continue
        with pytest.raises(autodice.AutodiceError) as caught:
            call()
        assert says in str(caught.value), (name, str(caught.value))
        assert not programs(out), name
    with autodice.open(out) as s:
        for name, frame, _ in (c for c in cases if c[2] == "FrameError"):
            with pytest.raises(FrameError):
                s.infer(frame)
            assert np.array_equal(s.infer(x), s.infer(x)), name  # still serving
        with pytest.raises(TypeError):  # not iterable: the caller's error, as itself
            list(s.map(123))
        got = list(s.map([x, None, x]))
        assert isinstance(got[1], FrameError) and np.array_equal(got[0], got[2])
        def raising():
            yield from (x, x)
            raise KeyError("the caller's")

        with pytest.raises(KeyError, match="the caller's"):
            list(s.map(raising()))
        stream = s.map(iter([x] * 5))
        next(stream)
        with pytest.raises(autodice.AutodiceError, match="already streaming"):
            s.infer(x)
        stream.close()
        with pytest.raises(autodice.AutodiceError, match="nothing to rebalance"):
            s.rebalance()
        assert s.stats()["frames"] >= 1
    for call in (lambda: s.infer(x), lambda: list(s.map([x]))):
        with pytest.raises(autodice.AutodiceError, match="closed"):
            call()
    assert not programs(out)
