"""int8 in the search: ``profile --int8`` times every layer quantized, and ``dse`` offers keys
in int8 (a precision gene per group of cores), priced as their plans are, written where ``gen``
takes them.

The search's profiles are FIXTURES (``test_cost.fixture_profile`` with int8 at 60 % of the
time and a quarter of the weights); the profile test measures.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from graphs import conv_chain
from test_cost import fixture_profile
from test_dse import PLATFORM
from test_report import CHROMIUM, browse

from autodice.backend.precision import Precision
from autodice.cli import main
from autodice.core.errors import AutodiceError
from autodice.core.model import load_model
from autodice.dse.profile import profile_from_json, profile_to_json, save_profile
from autodice.dse.profiler import run_profile
from autodice.frontend.split import split


def int8_fixture(graph, pace: float = 0.6):
    """FIXTURE: a layer in int8 takes ``pace`` times its fp32 time, its weights a quarter."""
    p = fixture_profile(graph)
    return replace(p, layers=tuple(
        replace(lc, int8_ms={t: pace * ms for t, ms in lc.cpu_ms.items()},
                int8_resident_bytes=lc.resident_bytes // 4) for lc in p.layers))


def search(model, tmp_path, pace: float) -> tuple[dict, str]:
    (tmp_path / "platform.txt").write_text(PLATFORM)
    save_profile(int8_fixture(load_model(model), pace), tmp_path / "profile.json")
    r = CliRunner().invoke(main, ["dse", str(model), "-p", str(tmp_path / "platform.txt"),
                                  "--profile", str(tmp_path / "profile.json"), "-o",
                                  str(tmp_path / "out"), "--pop", "24", "--gens", "25"])
    assert r.exit_code == 0, r.output  # dse holds every point's cost to its plan's
    return json.loads((tmp_path / "out" / "pareto.json").read_text()), r.output


def test_int8_keys_where_they_pay_written_as_gen_takes_them(zoo_model, tmp_path):
    """int8 faster and leaner: every point of the front has int8 keys (but GPU ones)."""
    model = zoo_model("squeezenet")
    doc, said = search(model, tmp_path, 0.6)
    assert all("precision" in p for p in doc["points"])
    assert "#int8 keys" in said and "--precision" in said
    point = doc["points"][0]
    text = (tmp_path / "out" / "mappings" / f"{point['point']}.precision").read_text().strip()
    assert text == point["precision"]
    keys = {item.split("=")[0] for item in text.split(",")}
    assert {d["key"] for d in point["ranks_detail"] if d["precision"] == "int8"} == keys
    assert not any(d["key"].endswith("_gpu") for p in doc["points"]
                   for d in p["ranks_detail"] if d["precision"] == "int8")  # no int8 on Vulkan
    plan = split(model, tmp_path / "out" / point["mapping"], tmp_path / "platform.txt",
                 tmp_path / "split")
    assert {k for k, v in Precision.parse(text, plan).keys} == keys  # what gen takes


def test_int8_slower_but_leaner_is_a_trade_off(zoo_model, tmp_path):
    """int8 slower (ShuffleNet's on this x86 machine: 0.7x) but leaner: the fastest points stay
    fp32, the leanest take int8."""
    doc, _ = search(zoo_model("squeezenet"), tmp_path, 1.5)
    fastest = max(doc["points"], key=lambda p: p["throughput_fps"])
    leanest = min(doc["points"], key=lambda p: p["memory_bytes"])
    assert "precision" not in fastest and "precision" in leanest
    assert not (tmp_path / "out" / "mappings" / f"{fastest['point']}.precision").exists()


def test_a_profile_with_int8_times_on_some_layers_only_is_refused(zoo_model):
    graph = load_model(zoo_model("squeezenet"))
    doc = profile_to_json(int8_fixture(graph))
    del doc["layers"][3]["int8_ms"]
    with pytest.raises(AutodiceError, match="int8_ms None: times of 0 or more at the profile's "
                                            "threads"):
        profile_from_json(doc)


@pytest.mark.cpp
def test_profile_times_every_layer_quantized(tmp_path):
    onnx.save(conv_chain(4, channels=32, side=48), tmp_path / "model.onnx")
    (tmp_path / "platform.txt").write_text("edge01, x86, slots=0-1\n")
    res = run_profile(tmp_path / "model.onnx", tmp_path / "platform.txt", threads=(1,),
                      runs=5, use_cache=False, int8=True)
    layers = res.profile.layers
    assert [lc.name for lc in layers] == ["Conv1", "Conv2", "Conv3", "Conv4"]
    assert all(set(lc.int8_ms) == {1} and lc.int8_ms[1] > 0 for lc in layers)
    # 32x32x3x3 weights in int8: less resident than in fp32, but the first's (fp32, as gen)
    assert all(lc.int8_resident_bytes < lc.resident_bytes for lc in layers[1:])
    assert res.whole_ms["int8 1"] > 0
    assert profile_from_json(profile_to_json(res.profile)) == res.profile


@pytest.mark.cpp
def test_an_accuracy_floor_keeps_int8_where_it_agrees(tmp_path):
    """Six seeded convolutions, int8 faster by the FIXTURE profile: every point has int8 keys.
    Held to a floor of 1.0 none stays int8 (quantization moves some argmax); to 0.3 they all
    do, each with its measured agreement (argmax masks' IoU: the output is 32 x 40 x 40)."""
    model = tmp_path / "chain.onnx"
    onnx.save(conv_chain(6, channels=32, side=40), model)
    (tmp_path / "platform.txt").write_text(  # CPUs only: no GPU point beats the int8 ones
        "edge01, arm, slots=0-3, power_idle=2.7W, power_cpu=1.1W, bandwidth=1gbit\n"
        "edge03, x86, slots=0-1, power_idle=10W, power_cpu=4W, bandwidth=100MB/s\n")
    save_profile(int8_fixture(load_model(model)), tmp_path / "profile.json")
    np.save(tmp_path / "frames.npy",
            np.random.default_rng(0).standard_normal((4, 32, 40, 40)).astype(np.float32))
    fronts = {}
    for floor in ("1.0", "0.3"):
        r = CliRunner().invoke(main, [
            "dse", str(model), "-p", str(tmp_path / "platform.txt"), "--profile",
            str(tmp_path / "profile.json"), "-o", str(tmp_path / floor), "--pop", "24", "--gens",
            "25", "--min-agreement", floor, "--calibration", str(tmp_path / "frames.npy"),
            "--agreement-frames", "4"])
        assert r.exit_code == 0, r.output
        fronts[floor] = json.loads((tmp_path / floor / "pareto.json").read_text())
        assert fronts[floor]["floor"] == {"min_agreement": float(floor), "frames": 4,
                                          "source": str(tmp_path / "frames.npy"),
                                          "preprocess": None}
    strict, loose = fronts["1.0"], fronts["0.3"]
    assert not any("precision" in p for p in strict["points"])
    assert any(n.startswith("below it: ") and "mean IoU of" in n for n in strict["notes"])
    assert all("precision" in p for p in loose["points"])
    for p in loose["points"]:
        assert 0.3 <= p["agreement"] < 1.0 and p["agreement_of"].startswith("mean IoU of ")
    # Below the floor, a point keeps its mapping with every key fp32, priced from its plan.
    kept = {p["point"]: p for p in strict["points"]}
    for p in loose["points"]:
        if p["point"] in kept:
            assert kept[p["point"]]["mapping"] == p["mapping"]
            assert kept[p["point"]]["throughput_fps"] <= p["throughput_fps"]
    if CHROMIUM:  # the page says how to make a point, and what it agrees
        first = loose["points"][0]
        dom = browse(Path(f"{tmp_path / '0.3' / 'report.html'}#point={first['point']}"),
                     tmp_path)
        assert dom.text["point-gen"] == (f"autodice gen OUT --precision {first['precision']} "
                                         "--calibration FRAMES")
        assert f"agreement {first['agreement']:.3f}" in dom.text["point-name"]
        assert "(int8)" in dom.text["point-ranks"]


def test_a_floor_needs_frames_and_a_share(zoo_model, tmp_path):
    model = zoo_model("squeezenet")
    base = ["dse", str(model), "-p", str(tmp_path / "platform.txt"), "--profile",
            str(tmp_path / "profile.json"), "-o", str(tmp_path / "out")]
    (tmp_path / "platform.txt").write_text(PLATFORM)
    save_profile(int8_fixture(load_model(model)), tmp_path / "profile.json")
    for args, said in [(["--min-agreement", "0.99"], "error: --min-agreement needs "
                                                     "--calibration SOURCE"),
                       (["--min-agreement", "1.5", "--calibration", "x.npy"],
                        "error: --min-agreement 1.5: a share, above 0 and at most 1"),
                       (["--calibration", "x.npy"], "error: --calibration: only with "
                                                    "--min-agreement")]:
        r = CliRunner().invoke(main, base + args)
        assert r.exit_code == 2 and r.output.startswith(said), r.output
        assert not (tmp_path / "out").exists()


@pytest.mark.cpp
def test_an_int8_ranks_predicted_memory_is_what_it_holds(tmp_path):
    """Five 256-channel 3x3 convolutions, the last four in int8: ncnn's x86 Winograd kernel for
    each is a 9.4 MB block of which it writes about half. The profile counts the pages written,
    and the int8 layers' own load-time bytes, so the predicted memory of the int8 rank is its
    peak resident memory (52.4 MB for 51.9 here; ResNet-50 121.5 for 121.5, where counting the
    blocks and fp32's load-time bytes predicted 184 MB)."""
    import autodice

    model = tmp_path / "chain.onnx"
    onnx.save(conv_chain(5, channels=256, side=14), model)
    (tmp_path / "platform.txt").write_text("edge01, x86, slots=0-1\n")
    (tmp_path / "mapping.json").write_text(json.dumps(
        {"edge01_cpu0": [f"Conv{k}" for k in range(1, 6)]}))
    rng = np.random.default_rng(0)
    np.save(tmp_path / "calib.npy", rng.standard_normal((8, 256, 14, 14)).astype(np.float32))
    np.save(tmp_path / "x.npy", rng.standard_normal((1, 256, 14, 14)).astype(np.float32))
    profile = autodice.profile(model, tmp_path / "platform.txt", threads=(1,), runs=3,
                               int8=True)
    quantized = sum(lc.int8_resident_bytes for lc in profile.layers)
    assert quantized < 0.7 * sum(lc.resident_bytes for lc in profile.layers)  # was 1.0x
    autodice.split(model, tmp_path / "mapping.json", tmp_path / "platform.txt", tmp_path / "out")
    autodice.gen(tmp_path / "out", precision="int8", calibration=tmp_path / "calib.npy",
                 keep_fp32=("first",))  # as the profile quantizes
    autodice.build(tmp_path / "out")
    held = autodice.run(tmp_path / "out", {"input": tmp_path / "x.npy"},
                        frames=3).stats["ranks"][0]["peak_rss"]
    predicted = autodice.predict(tmp_path / "out", profile).ranks[0].memory
    assert abs(predicted / held - 1) < 0.05, (predicted, held)
