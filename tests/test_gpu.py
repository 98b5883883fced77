"""GPU ranks for real: ncnn's Vulkan path on Mesa's lavapipe (Vulkan on the CPU), under mpirun,
equal to onnxruntime within the fp16 tolerance, the device each rank ran on in stats.json, and a
GPU rank on a host without a Vulkan device refused with one clear error (or, when asked, computed
on the CPU and reported so). lavapipe runs the GPU path's real code; its speed is not a GPU's.
"""

from __future__ import annotations

import io
import json
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import requires_vulkan
from graphs import past_fp16
from rich.console import Console

import autodice
from autodice.backend.build import build
from autodice.backend.gen import gen, render_program
from autodice.backend.run import check_tolerance, run
from autodice.core.errors import AutodiceError
from autodice.core.model import load_model
from autodice.core.plan import load_plan
from autodice.frontend.layers import layer_table
from autodice.frontend.split import split

pytestmark = [pytest.mark.cpp, requires_vulkan]


def cpu_gpu_cpu(graph, host: str = "edge01") -> dict[str, list[str]]:
    """The layers in order: 40 % on one core, the next 10 % on the GPU, the rest on another
    core (a short GPU stage: lavapipe is Vulkan on the CPU, ~75x slower than ncnn there)."""
    names = [r["name"] for r in layer_table(graph) if not r["follows"]]
    a, b = int(len(names) * 0.4), int(len(names) * 0.5)
    return {f"{host}_arm0": names[:a], f"{host}_gpu": names[a:b], f"{host}_arm1": names[b:]}


@pytest.mark.parametrize("name", ["squeezenet", "resnet50"])
def test_a_gpu_stage_between_two_cpu_stages_matches_onnxruntime(tmp_path, zoo_model, name):
    path = zoo_model(name)
    (tmp_path / "platform.txt").write_text("edge01, arm, slots=0-1, gpu=NVIDIAVolta (CUDA)\n")
    (tmp_path / "mapping.json").write_text(json.dumps(cpu_gpu_cpu(load_model(path))))
    split(path, tmp_path / "mapping.json", tmp_path / "platform.txt", tmp_path / "out")
    gen(tmp_path / "out")
    build(tmp_path / "out")
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    plan_input = load_model(path).inputs[0]  # data_0, or gpu_0/data_0
    res = run(tmp_path / "out", {plan_input: tmp_path / "x.npy"}, frames=2)
    devices = [(r["device"].split(":")[0], r["precision"]) for r in res.stats["ranks"]]
    assert devices == [("cpu", "fp32"), ("vulkan", "fp16"), ("cpu", "fp32")]
    assert check_tolerance(res.stats) == (1e-2, "fp16 on rank 1")  # docs/gpu.md's figure
    (name_out,) = res.outputs
    want = ort.InferenceSession(str(path)).run(None, {plan_input: x})[0]
    got = res.outputs[name_out]
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel < 1e-2, rel
    assert got.argmax() == want.argmax()


def test_fp32_on_the_gpu_matches_like_the_cpu(fig2):
    split(fig2 / "model.onnx", fig2 / "mapping.json", fig2 / "platform.txt", fig2 / "out")
    gen(fig2 / "out", precision="fp32")
    build(fig2 / "out")
    x = np.random.default_rng(3).standard_normal((1, 4, 8, 8)).astype(np.float32)
    np.save(fig2 / "x.npy", x)
    res = run(fig2 / "out", {"input": fig2 / "x.npy"}, frames=3)
    assert [r["precision"] for r in res.stats["ranks"]] == ["fp32"] * 3
    assert [r["device"].startswith("vulkan:") for r in res.stats["ranks"]] == [False, True, True]
    want = ort.InferenceSession(str(fig2 / "model.onnx")).run(None, {"input": x})[0]
    np.testing.assert_allclose(res.outputs["output"], want, rtol=1e-5, atol=1e-5)


def test_a_gpu_rank_without_a_vulkan_device_is_one_clear_error(fig2, monkeypatch):
    split(fig2 / "model.onnx", fig2 / "mapping.json", fig2 / "platform.txt", fig2 / "out")
    gen(fig2 / "out")
    build(fig2 / "out")
    np.save(fig2 / "x.npy", np.ones((1, 4, 8, 8), np.float32))
    # No driver to be found: what a board without a GPU driver looks like. Both variables, as
    # a GPU machine names its driver in either (VK_DRIVER_FILES won on an H200's).
    for name in ("VK_ICD_FILENAMES", "VK_DRIVER_FILES"):
        monkeypatch.setenv(name, str(fig2 / "no-such-driver.json"))
    with pytest.raises(AutodiceError) as e:
        run(fig2 / "out", {"input": fig2 / "x.npy"}, frames=2)
    said = "\n".join(e.value.problems)
    # Both GPU ranks stop at start; whichever reports first names itself.
    assert re.search(r"rank (1 \(edge01_gpu on edge01\)|2 \(edge04_gpu on edge04\)) is a GPU "
                     r"rank, but there is no Vulkan device 0 \(ncnn found 0;", said), said
    assert "--gpu-fallback cpu" in said
    res = run(fig2 / "out", {"input": fig2 / "x.npy"}, frames=2, gpu_fallback=True)
    assert [r["device"] for r in res.stats["ranks"]] == ["cpu", "cpu (no Vulkan device)",
                                                          "cpu (no Vulkan device)"]
    # On the CPU a GPU rank computes as a CPU rank does (fp32 under auto), not in its GPU's
    # fp16: it said fp16 (and computed so on ARMv8.2 CPUs), and the check's tolerance widened.
    assert [r["precision"] for r in res.stats["ranks"]] == ["fp32"] * 3
    want = ort.InferenceSession(str(fig2 / "model.onnx")).run(
        None, {"input": np.ones((1, 4, 8, 8), np.float32)})[0]
    np.testing.assert_allclose(res.outputs["output"], want, rtol=1e-5, atol=1e-5)


def test_a_gpu_rank_whose_values_pass_fp16s_range_computes_in_fp32(tmp_path):
    """fp16 holds up to 65504: a GPU rank whose activations reach 2e5 computed NaN in fp16 (every
    frame of a seeded ResNet-50 on an H100). Under auto, gen keeps such a rank in fp32 and says
    why; what fp16 would have computed there is run too, so the rule's reason is shown here."""
    onnx.save(past_fp16(), tmp_path / "model.onnx")
    (tmp_path / "platform.txt").write_text("edge01, x86, slots=0-1, gpu=NVIDIAVolta (CUDA)\n")
    (tmp_path / "mapping.json").write_text(json.dumps(
        {"edge01_cpu0": ["Conv1"], "edge01_gpu": ["Conv2", "Conv3", "Conv4"]}))
    out = tmp_path / "out"
    split(tmp_path / "model.onnx", tmp_path / "mapping.json", tmp_path / "platform.txt", out)
    said = io.StringIO()
    gen(out, console=Console(file=said, width=200))
    assert re.search(r'^rank 1 \(key "edge01_gpu"\): values up to 2\.02e\+05 \(tensor "Buff3"\),'
                     r" past fp16's 65504 / 4: it computes in fp32 on its GPU", said.getvalue(),
                     re.M), said.getvalue()
    build(out)
    x = np.random.default_rng(0).standard_normal((1, 16, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    want = ort.InferenceSession(str(tmp_path / "model.onnx")).run(None, {"input": x})[0]
    res = run(out, {"input": tmp_path / "x.npy"}, frames=2)
    assert [(r["device"].split(":")[0], r["precision"]) for r in res.stats["ranks"]] == \
        [("cpu", "fp32"), ("vulkan", "fp32")]
    np.testing.assert_allclose(res.outputs["output"], want, rtol=1e-4, atol=1e-4 * 245)

    # The same program with the GPU rank in fp16, as gen wrote it before: NaN.
    (out / "packages" / "edge01" / "program.cpp").write_text(render_program(load_plan(out)))
    build(out)
    res = run(out, {"input": tmp_path / "x.npy"}, frames=2)
    assert [r["precision"] for r in res.stats["ranks"]] == ["fp32", "fp16"]
    assert not np.isfinite(res.outputs["output"]).all()


def test_a_gpu_rank_that_reads_the_model_input_takes_it_from_the_sessions_slots(fig2):
    """The first stage on the GPU: it maps the session's frame slots as a CPU rank does, copies
    each frame from there into the Mat it uploads, and every result equals onnxruntime's."""
    (fig2 / "mapping.json").write_text(json.dumps(
        {"edge01_gpu": ["MaxPool1", "Conv1", "FC1"], "edge01_arm1": ["Add1", "Relu1"]}))
    out = fig2 / "out"
    split(fig2 / "model.onnx", fig2 / "mapping.json", fig2 / "platform.txt", out)
    gen(out, precision="fp32")
    build(out)
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal((1, 4, 8, 8)).astype(np.float32) for _ in range(40)]
    ref = ort.InferenceSession(str(fig2 / "model.onnx"))
    with autodice.open(out) as s:
        got = list(s.map(xs))
    st = s.stats()
    assert [r["device"].split(":")[0] for r in st["ranks"]] == ["vulkan", "cpu"]
    assert [r["frames_from_slots"] for r in st["ranks"]] == [40, 0]
    assert len(got) == 40
    for i, (g, x) in enumerate(zip(got, xs)):
        want = ref.run(None, {"input": x})[0]
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5, err_msg=f"frame {i}")
