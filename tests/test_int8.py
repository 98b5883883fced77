"""int8 keys (``gen --precision int8``): the quantization autodice computes for ncnn, the files
it writes, and int8 ranks built and run under mpirun beside fp32 ones.

Accuracy on trained weights is tests/test_trained_ocr.py's (PP-OCR's text detector and
recognizer in int8); these use seeded convolutions, where agreement says only that the
arithmetic is right.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from graphs import conv_chain

from autodice.backend.build import build
from autodice.backend.int8 import LayerLine, Stats, mse_threshold, quantize_weights, \
    requantized_span
from autodice.backend.precision import Precision
from autodice.backend.run import run
from autodice.cli import main
from autodice.core.errors import AutodiceError
from autodice.frontend.split import split


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_the_threshold_keeps_a_tall_top_bin_and_clips_a_rare_tail():
    picture = np.zeros(2048)
    picture[100:2048] = 10.0
    picture[-1] = 1e5  # a bright background: one value, everywhere
    assert mse_threshold(Stats(2.5, picture)) == pytest.approx(2.5, rel=1e-3)
    tail = np.zeros(2048)
    tail[:64] = 1e6  # nearly everything below 1/32 of the largest value
    tail[2047] = 1.0  # and one value far out
    assert mse_threshold(Stats(32.0, tail)) < 2.0


def test_weights_round_half_away_from_zero_with_a_scale_per_row():
    w = np.array([[1.0, -0.5, 0.25, 0.0], [0.0, 0.0, 0.0, 0.0], [2.0, -2.0, 1.0, 1.0 / 254],
                  [1e-39, 0.0, -1e-39, 0.0]], np.float32)
    q, scales = quantize_weights(w, 4)
    assert scales.tolist() == pytest.approx([127.0, 1.0, 63.5, 1.0])  # last: 1.27e41 is no fp32
    assert q.reshape(4, 4).tolist() == [[127, -64, 32, 0], [0, 0, 0, 0], [127, -127, 64, 0],
                                        [0, 0, 0, 0]]


def test_a_convolutions_weights_rewritten_as_ncnn_reads_them():
    layer = LayerLine(1, 3, "Convolution", "conv_0", {"0": "2", "5": "1", "6": "6"})
    weights = np.array([1, -1, 0.5, 2, 0, -4], np.float32)
    bias = np.array([0.25, -0.75], np.float32)
    span = struct.pack("<I", 0) + weights.tobytes() + bias.tobytes()
    new = requantized_span(layer, span, 12.5)
    assert struct.unpack_from("<I", new)[0] == 0x000D4B38  # ncnn's int8 tag
    assert list(np.frombuffer(new, np.int8, 6, 4)) == [127, -127, 64, 64, 0, -127]
    assert new[10:12] == b"\0\0"  # 6 int8 weights padded to 8 bytes
    rest = np.frombuffer(new, "<f4", offset=12)
    assert rest.tolist() == pytest.approx([0.25, -0.75, 127.0, 31.75, 12.5])  # bias, scales, input
    assert requantized_span(layer, span[:-4], 12.5) is None  # not as pnnx writes: left fp32


def test_precision_key_by_key(fig2):
    plan = split(fig2 / "model.onnx", fig2 / "mapping.json", fig2 / "platform.txt", fig2 / "out")
    keys = [r.key for r in plan.ranks]
    p = Precision.parse(f"fp32,{keys[0]}=int8", plan)
    assert [p.of(r) for r in plan.ranks] == ["int8", "fp32", "fp32"]
    assert str(p) == f"fp32,{keys[0]}=int8" and str(Precision.parse("auto")) == "auto"
    assert Precision.parse("b_arm0-3,8-11=int8,fp32").keys == (("b_arm0-3,8-11", "int8"),)
    for bad, said in [("int4", "'int4': the precision is one of auto, fp32, fp16, int8"),
                      ("nosuch=int8", 'no key "nosuch" in the mapping'),
                      ("fp32,fp16", "two precisions for every key"),
                      (f"{keys[1]}=int8,{keys[1]}=fp16", f'key "{keys[1]}" given twice')]:
        with pytest.raises(AutodiceError, match=said):
            Precision.parse(bad, plan)


@pytest.fixture
def chain(tmp_path):
    """Six seeded 3x3 convolutions over two keys of one host, and 16 calibration frames."""
    model = conv_chain(6, channels=32, side=40)
    onnx.save(model, tmp_path / "model.onnx")
    (tmp_path / "platform.txt").write_text("edge01, cpu, slots=0-1\n")
    (tmp_path / "mapping.json").write_text(json.dumps(
        {"edge01_cpu0": [f"Conv{k}" for k in (1, 2, 3)],
         "edge01_cpu1": [f"Conv{k}" for k in (4, 5, 6)]}))
    split(tmp_path / "model.onnx", tmp_path / "mapping.json", tmp_path / "platform.txt",
          tmp_path / "out")
    rng = np.random.default_rng(0)
    np.save(tmp_path / "calib.npy", rng.standard_normal((16, 32, 40, 40)).astype(np.float32))
    np.save(tmp_path / "x.npy", rng.standard_normal((1, 32, 40, 40)).astype(np.float32))
    return tmp_path


@pytest.mark.cpp
def test_an_int8_key_beside_an_fp32_key(chain):
    out = chain / "out"
    r = invoke("gen", out, "--precision", "edge01_cpu1=int8", "--calibration",
               chain / "calib.npy", "--keep-fp32", "")
    assert r.exit_code == 0, r.output
    said = [line for line in r.output.splitlines() if line.startswith("rank")]
    assert len(said) == 1 and said[0].startswith('rank 1 (key "edge01_cpu1"): int8, 3 of 3 '
                                                 "layers; off by "), r.output
    params = {k: (out / "ncnn" / f"edge01_cpu{k}.ncnn.param").read_text() for k in (0, 1)}
    assert params[0].count(" 8=2") == 0 and params[1].count(" 8=2") == 3
    sizes = [(out / "ncnn" / f"edge01_cpu{k}.ncnn.bin").stat().st_size for k in (0, 1)]
    assert sizes[1] <= 0.3 * sizes[0]  # the same three convolutions, int8 against fp32
    assert (out / "packages" / ".precision").read_text() == "edge01_cpu1=int8\n"
    build(out)
    res = run(out, {"input": chain / "x.npy"}, frames=3)
    assert [r["precision"] for r in res.stats["ranks"]] == ["fp32", "int8"]
    want = ort.InferenceSession(str(chain / "model.onnx")).run(
        None, {"input": np.load(chain / "x.npy")})[0]
    got = res.outputs["output"].reshape(want.shape)
    assert 0 < np.abs(got - want).max() / np.abs(want).max() < 0.05


@pytest.mark.cpp
def test_int8_refuses_what_it_cannot_calibrate_on_and_writes_nothing(chain):
    out = chain / "out"
    (chain / "empty").mkdir()
    np.save(chain / "small.npy", np.zeros((4, 32, 20, 20), np.float32))
    before = sorted(p.name for p in out.iterdir())
    for args, said in [
        ((), "error: --precision int8 needs --calibration DIR|batch.npy"),
        (("--calibration", chain / "empty"), f"error: --calibration {chain / 'empty'}: "),
        (("--calibration", chain / "small.npy"), f"error: --calibration {chain / 'small.npy'}: "
         f"{chain / 'small.npy'}: 4x32x20x20 is neither one frame nor a batch (N, ...) of frames "
         "of 1x32x40x40"),
        (("--calibration", chain / "calib.npy", "--keep-fp32", "nosuch"),
         "error: --keep-fp32 nosuch: no int8 rank has a layer of that name"),
    ]:
        r = invoke("gen", out, "--precision", "int8", *args)
        assert r.exit_code == 2 and r.output.startswith(said), r.output
        assert len(r.output.strip().splitlines()) == 1, r.output
        assert sorted(p.name for p in out.iterdir()) == before


def test_outputs_judged_as_a_user_reads_them():
    from autodice.backend.agreement import OutputAgreement, judge

    scores = OutputAgreement("prob", "tensor")
    want = np.array([[0.1, 0.5, 0.2, 0.05, 0.05, 0.04, 0.06]])
    judge("prob", np.array([[0.1, 0.2, 0.5, 0.05, 0.05, 0.04, 0.06]]), want, scores)
    assert (scores.kind, scores.agree, scores.top5) == ("classes", [0.0], [1.0])
    masks = OutputAgreement("seg", "tensor")
    want = np.zeros((1, 2, 4, 4))
    want[0, 1, :2] = 1.0  # class 1 on the top half
    got = want.copy()
    got[0, 1, 1] = 0.0  # one row lost
    judge("seg", got, want, masks)
    assert masks.kind == "mask" and masks.agree == [pytest.approx((8 / 12 + 4 / 8) / 2)]
    maps = OutputAgreement("map", "tensor")
    judge("map", np.full((1, 1, 2, 2), 0.9), np.array([[[[0.9, 0.9], [0.1, 0.1]]]]), maps)
    assert maps.kind == "map" and maps.agree == [0.5]
