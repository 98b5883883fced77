"""Fidelity: models as users bring them, split under random mappings, run distributed, equal to
onnxruntime within 1e-4 of the output's scale and with the same top-1.

Two parts:

* Drawn with onnx.helper (no torch), CI runs them: a small ConvNeXt spelled as torch's dynamo
  exporter spells it, and ShuffleNet's channel shuffle cut at its 5-D tensors.
* The suite (marked ``slow``): thirteen torchvision CNNs, fifteen timm edge backbones (mobile
  CNNs, hybrids, ViTs, re-parameterizable nets), five Ultralytics YOLOs (YOLOv8n, YOLO11n,
  YOLO26n, YOLOv8n-seg, YOLO26n-seg) and two torchvision segmenters, each exported by the
  dynamo exporter (opset 18) and the TorchScript one (opset 17), each split under three seeded
  mappings (2, 3 and 4 keys; contiguous, or interleaved runs of layers, which cut the YOLOs'
  heads between their scales' Concats, the DFL softmax and the Split of boxes and scores) and
  put through split -> gen (every conversion checked in ncnn) -> build -> run under mpirun. It
  needs torch, torchvision, timm and ultralytics (the ``fidelity`` extra) and skips without
  them; ``AUTODICE_TORCH_PYTHON=/path/to/python`` exports with another Python that has them
  instead. Exports are cached under ``~/.cache/autodice/fidelity``, keyed by those packages'
  versions, onnx's and the export script.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from fidelity_export import (DETECTORS, MODELS, NMS_FREE, OPSETS, SEGMENTERS,
                             TIMM_MODELS)
from graphs import channel_shuffle, convnext_dynamo
from onnx import TensorProto, helper, numpy_helper

from autodice.backend.build import build
from autodice.backend.engine import cache_root
from autodice.backend.gen import gen
from autodice.backend.model_check import check_model
from autodice.backend.run import run
from autodice.core.model import load_model
from autodice.frontend.check import check, session
from autodice.frontend.split import split

HERE = Path(__file__).parent
EXPORT = HERE / "fidelity_export.py"
RTOL = 1e-4


def random_mapping(model: Path, seed: int, most: int = 4) -> dict[str, list[str]]:
    """A seeded mapping of every layer of ``model`` over 2 + seed % 3 keys (at most ``most``).

    Seed 0 (mod 3) cuts the layers into one contiguous run per key at random places; seed 1
    deals runs of 1-12 layers, seed 2 runs of 1-3 layers, to random keys (ping-pong between
    ranks, many runs per key, cuts inside blocks and between a branch and its join).
    """
    graph = load_model(model)
    layers = [graph.names[i] for i in range(len(graph.nodes)) if i not in graph.followers]
    rng = random.Random(seed)
    keys = [f"edge01_x86{k}" for k in range(min(2 + seed % 3, most))]
    mapping: dict[str, list[str]] = {k: [] for k in keys}
    if seed % 3 == 0:
        cuts = sorted(rng.sample(range(1, len(layers)), len(keys) - 1))
        for key, lo, hi in zip(keys, [0, *cuts], [*cuts, len(layers)]):
            mapping[key] = layers[lo:hi]
        return mapping
    longest = 12 if seed % 3 == 1 else 3
    start, turn = 0, 0
    while start < len(layers):
        length = rng.randint(1, longest)
        # The first runs go to each key in turn, so that every key gets layers.
        key = keys[turn] if turn < len(keys) else rng.choice(keys)
        mapping[key] += layers[start:start + length]
        start, turn = start + length, turn + 1
    return {k: v for k, v in mapping.items() if v}


def run_distributed(model: Path, mapping: dict[str, list[str]], work: Path,
                    x: np.ndarray) -> dict[str, float]:
    """split -> gen -> build -> run ``model`` under ``mapping`` on ``x``; assert every output
    equals onnxruntime's within RTOL of its scale with the same top-1. Returns output -> rel."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "platform.txt").write_text("edge01, x86, slots=0-3\n")
    (work / "mapping.json").write_text(json.dumps(mapping, indent=1))
    split(model, work / "mapping.json", work / "platform.txt", work / "out")
    gen(work / "out")
    build(work / "out")
    ref = session(model)
    name = ref.get_inputs()[0].name
    np.save(work / "x.npy", x)
    got = run(work / "out", {name: work / "x.npy"}).outputs
    rels = {}
    for spec, want in zip(ref.get_outputs(), ref.run(None, {name: x})):
        diff = float(np.max(np.abs(got[spec.name] - want)))
        scale = float(np.max(np.abs(want)))
        rels[spec.name] = diff / scale
        assert rels[spec.name] <= RTOL, f"{spec.name}: max|diff| {diff:.3g}, {rels[spec.name]:.3g}"
        assert_same_top1(got[spec.name].reshape(want.shape), want, RTOL * scale, spec.name)
    return rels


def assert_same_top1(got: np.ndarray, want: np.ndarray, tol: float, name: str) -> None:
    """ncnn's top-1 is onnxruntime's, up to a tie within ``tol`` in onnxruntime's own values: of
    the whole output, and of every pixel's classes where it is a map (N x C x H x W). A
    segmenter's upsampled map repeats values over neighbouring pixels, so its top-1 over the
    whole map is a tie among them."""
    if want.ndim == 4:
        picked = np.take_along_axis(want, got.argmax(axis=1)[:, None], axis=1)[:, 0]
        lost = picked < want.max(axis=1) - tol
        assert not lost.any(), f"{name}: {int(lost.sum())} pixels' top-1 class differs"
    else:
        assert want.flat[got.argmax()] >= want.max() - tol, f"{name}: top-1 differs"


# The ConvNeXt graph cut where the legalize rewrites matter: inside the channel LayerNorm (a
# rank holding only its second ReduceMean), between the head's Reshape and its Gather (a rank
# whose input is the 1-D mean), and through a block's GELU.
CONVNEXT_MAPPINGS = {
    "contiguous": 0,
    "interleaved": 1,
    "cuts": {"edge01_x860": ["node_conv2d", "node_stage1_dw", "node_stage1_permute",
                             "node_stage1_layer_norm", "node_stage1_mm1", "node_stage1_linear",
                             "node_stage1_div", "node_stage1_erf"],
             "edge01_x861": ["node_stage1_erf1", "node_stage1_half", "node_stage1_gelu",
                             "node_stage1_mm2", "node_stage1_linear_1", "node_stage1_permute_1",
                             "node_stage1_mul", "node_stage1_add", "node_mean", "node_sub",
                             "node_pow", "node_flat", "node_as_strided", "node_permute_head",
                             "node_layer_norm_head", "node_permute_head_1", "node_view",
                             "node_logits"],
             "edge01_x862": ["node_mean_1", "node_add_eps", "node_sqrt", "node_div",
                             "node_mul_ln", "node_add_ln", "node_conv2d_down", "node_stage2_dw",
                             "node_stage2_permute", "node_stage2_layer_norm", "node_stage2_mm1",
                             "node_stage2_linear", "node_stage2_div", "node_stage2_erf",
                             "node_stage2_erf1", "node_stage2_half", "node_stage2_gelu",
                             "node_stage2_mm2", "node_stage2_linear_1", "node_stage2_permute_1",
                             "node_stage2_mul", "node_stage2_add", "node_mean_2"]},
}


@pytest.mark.cpp
@pytest.mark.parametrize("how", list(CONVNEXT_MAPPINGS))
def test_convnext_as_dynamo_spells_it_runs_like_onnxruntime(tmp_path, how):
    model = tmp_path / "convnext.onnx"
    # Weights beside the model as dynamo writes them (the sub-models' weights stay external).
    onnx.save(convnext_dynamo(), model, save_as_external_data=True,
              location="convnext.onnx.data", size_threshold=1024)
    mapping = CONVNEXT_MAPPINGS[how]
    if isinstance(mapping, int):
        mapping = random_mapping(model, mapping, most=3)
    assert 2 <= len(mapping) <= 3
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    run_distributed(model, mapping, tmp_path, x)



@pytest.mark.cpp
def test_dynamo_gelu_becomes_one_ncnn_layer(tmp_path):
    """x * (0.5 * (erf(x / sqrt2) + 1)), reordered for pnnx: one GELU layer per block."""
    model = tmp_path / "convnext.onnx"
    onnx.save(convnext_dynamo(), model)
    graph = load_model(model)
    (tmp_path / "platform.txt").write_text("edge01, x86, slots=0-3\n")
    (tmp_path / "mapping.json").write_text(json.dumps({"edge01_x860": [
        graph.names[i] for i in range(len(graph.nodes)) if i not in graph.followers]}))
    split(model, tmp_path / "mapping.json", tmp_path / "platform.txt", tmp_path / "out")
    gen(tmp_path / "out")  # checks the conversion against onnxruntime, too
    layers = [line.split()[0] for line in
              (tmp_path / "out" / "ncnn" / "edge01_x860.ncnn.param").read_text().splitlines()[2:]]
    assert layers.count("GELU") == 2 and "Erf" not in layers


def test_gelus_half_sent_to_another_rank_is_left_as_it_is(tmp_path):
    """The reorder for pnnx changes what GELU's inner Mul computes: not where another rank (or
    the caller) reads that tensor too. The check used to find the outputs before they were
    listed, so the rank reading it got x * (erf + 1), twice its value."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 8]) for n in ("y", "z")]
    consts = [numpy_helper.from_array(np.array(v, np.float32), n)
              for n, v in (("sqrt2", np.sqrt(2.0)), ("one", 1.0), ("half", 0.5))]
    nodes = [helper.make_node("Div", ["x", "sqrt2"], ["d"], name="div"),
             helper.make_node("Erf", ["d"], ["e"], name="erf"),
             helper.make_node("Add", ["e", "one"], ["a"], name="add"),
             helper.make_node("Mul", ["a", "half"], ["m"], name="half"),
             helper.make_node("Mul", ["x", "m"], ["y"], name="gelu"),
             helper.make_node("Relu", ["m"], ["z"], name="relu")]
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], outs, consts),
                                opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "m.onnx")
    (tmp_path / "platform.txt").write_text("edge01, x86, slots=0-1\n")
    (tmp_path / "mapping.json").write_text(json.dumps({
        "edge01_x860": ["div", "erf", "add", "half", "gelu"], "edge01_x861": ["relu"]}))
    split(tmp_path / "m.onnx", tmp_path / "mapping.json", tmp_path / "platform.txt",
          tmp_path / "out")
    assert all(d.rel < 1e-6 for d in check(tmp_path / "out")), check(tmp_path / "out")


@pytest.mark.cpp
def test_a_channel_shuffle_cut_at_both_5d_tensors_runs_like_onnxruntime(tmp_path):
    """Each rank gets a 5-D tensor: pnnx must see its batch axis or the Transpose is lost."""
    onnx.save(channel_shuffle(), tmp_path / "shuffle.onnx")
    mapping = {"edge01_x860": ["conv1", "to_groups"], "edge01_x861": ["swap"],
               "edge01_x862": ["back", "conv2"]}
    x = np.random.default_rng(0).standard_normal((1, 8, 6, 6)).astype(np.float32)
    run_distributed(tmp_path / "shuffle.onnx", mapping, tmp_path, x)


@pytest.mark.cpp
def test_a_rank_whose_only_layer_adds_zeros_still_sends(tmp_path):
    """TorchScript shares one all-zero bias between layers; a rank holding only that Add
    receives x and sends x + 0, which pnnx folds to nothing (``Input in0 0 1 out0``)."""
    zeros = numpy_helper.from_array(np.zeros(4, np.float32), "zeros")
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 4, 1, 1))
                                .astype(np.float32), "w")
    flat, image = (numpy_helper.from_array(np.array(s, np.int64), n)
                   for n, s in (("flat", [4, 36]), ("image", [1, 4, 6, 6])))
    # 2-D between the ranks: a 4-D tensor would reach the Add through the batch-pinning MaxPool.
    nodes = [helper.make_node("Conv", ["input", "w"], ["c1"], name="conv1"),
             helper.make_node("Reshape", ["c1", "flat"], ["f"], name="flat"),
             helper.make_node("Transpose", ["f"], ["t"], name="rows", perm=[1, 0]),
             helper.make_node("Add", ["zeros", "t"], ["b"], name="bias"),
             helper.make_node("Transpose", ["b"], ["u"], name="cols", perm=[1, 0]),
             helper.make_node("Reshape", ["u", "image"], ["i"], name="image"),
             helper.make_node("Conv", ["i", "w"], ["output"], name="conv2")]
    graph = helper.make_graph(nodes, "zero_bias",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                             [1, 4, 6, 6])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT,
                                                             [1, 4, 6, 6])],
                              [zeros, w, flat, image])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=8), tmp_path / "zero_bias.onnx")
    mapping = {"edge01_x860": ["conv1", "flat", "rows"], "edge01_x861": ["bias"],
               "edge01_x862": ["cols", "image", "conv2"]}
    x = np.random.default_rng(1).standard_normal((1, 4, 6, 6)).astype(np.float32)
    run_distributed(tmp_path / "zero_bias.onnx", mapping, tmp_path, x)
    param = (tmp_path / "out" / "ncnn" / "edge01_x861.ncnn.param").read_text()
    assert "Noop" in param  # what the test is about: pnnx did fold the Add away


@pytest.mark.cpp
def test_a_detectors_scores_cut_after_their_sigmoid_pass_the_check(tmp_path):
    """A YOLO head's class scores on noise sit in the sigmoid's tail (logits near -11: 1e-5 to
    2e-4), where onnxruntime's Sigmoid, a rational approximation good to 1e-7 absolute, is off
    by 0.7 % of their scale. ncnn computes the function; gen's check holds the rank to it."""
    rng = np.random.default_rng(0)
    w, b, box = (numpy_helper.from_array(a.astype(np.float32), n) for n, a in (
        ("w", 0.01 * rng.standard_normal((80, 16, 1, 1))),
        ("b", np.full(80, -11.5)),  # Ultralytics' prior for a class's bias
        ("box", 50 * rng.standard_normal((4, 16, 1, 1)))))
    # The output as YOLO's: boxes in pixels beside the scores, which its scale leaves unseen.
    nodes = [helper.make_node("Conv", ["images", "w", "b"], ["logits"], name="cls"),
             helper.make_node("Sigmoid", ["logits"], ["scores"], name="sigmoid"),
             helper.make_node("Conv", ["images", "box"], ["boxes"], name="box"),
             helper.make_node("Concat", ["boxes", "scores"], ["output"], name="cat", axis=1)]
    graph = helper.make_graph(nodes, "scores",
                              [helper.make_tensor_value_info("images", TensorProto.FLOAT,
                                                             [1, 16, 20, 20])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT,
                                                             [1, 84, 20, 20])], [w, b, box])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=8), tmp_path / "scores.onnx")
    mapping = {"edge01_x860": ["cls", "sigmoid"], "edge01_x861": ["box", "cat"]}
    x = rng.standard_normal((1, 16, 20, 20)).astype(np.float32)
    run_distributed(tmp_path / "scores.onnx", mapping, tmp_path, x)


def _wrong_layer(kind: str):
    """(nodes, constants) of one layer pnnx converts wrong, from "r2" to "mid": a cubic Resize
    with TensorFlow's coefficient (-0.5; pnnx converts it as torch's -0.75), or an opset-18
    GroupNormalization (scale and bias per group), past which onnx infers no shapes."""
    if kind == "tf_resize":
        return ([helper.make_node("Resize", ["r2", "", "twice"], ["up"], name="tf_resize",
                                  mode="cubic", cubic_coeff_a=-0.5),
                 helper.make_node("MaxPool", ["up"], ["mid"], name="pool",
                                  kernel_shape=[2, 2], strides=[2, 2])],
                [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "twice")])
    return ([helper.make_node("GroupNormalization", ["r2", "gs", "gb"], ["mid"],
                              name="group_norm", num_groups=2)],
            [numpy_helper.from_array(np.array(v, np.float32), n)
             for n, v in (("gs", [1.5, 0.5]), ("gb", [0.2, -0.3]))])


@pytest.mark.cpp
@pytest.mark.parametrize("kind", ["tf_resize", "group_norm"])
def test_will_it_run_names_the_first_layer_that_computes_wrong(tmp_path, kind):
    """``layers --check`` cuts a model down to the one layer ncnn computes wrong, among
    convolutions that all run. Past the opset-18 GroupNormalization onnx infers no shapes: the
    cuts there take the shapes onnxruntime makes (without them no cut could be made)."""
    from click.testing import CliRunner

    from autodice.cli import main

    rng = np.random.default_rng(0)
    layer, inits = _wrong_layer(kind)
    nodes, x = [], "input"
    for k in range(6):
        inits.append(numpy_helper.from_array((0.3 * rng.standard_normal((8, 8, 3, 3)))
                                             .astype(np.float32), f"w{k}"))
        nodes += [helper.make_node("Conv", [x, f"w{k}"], [f"c{k}"], name=f"conv{k}",
                                   pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{k}"], [f"r{k}"], name=f"relu{k}")]
        x = f"r{k}"
        if k == 2:
            nodes += layer
            x = "mid"
    graph = helper.make_graph(nodes, kind, [helper.make_tensor_value_info(
        "input", TensorProto.FLOAT, [1, 8, 16, 16])], [helper.make_tensor_value_info(
            x, TensorProto.FLOAT, [1, 8, 16, 16])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                                ir_version=8), tmp_path / f"{kind}.onnx")
    r = CliRunner().invoke(main, ["layers", str(tmp_path / f"{kind}.onnx"), "--check"])
    assert r.exit_code == 1, r.output
    assert f'the first layer that fails is "{kind}"' in r.output, r.output


CASES = [pytest.param(m, e, seed, id=f"{m}-{e}-m{seed}")
         for m in (*MODELS, *TIMM_MODELS, *DETECTORS, *SEGMENTERS) for e in OPSETS
         for seed in range(3)]


@pytest.fixture(scope="session")
def torch_python() -> str:
    """A Python with torch, torchvision, timm and ultralytics: ``$AUTODICE_TORCH_PYTHON``, else
    this one."""
    python = os.environ.get("AUTODICE_TORCH_PYTHON")
    if python:
        return python
    why = "the fidelity suite exports with torch: make fidelity, or pip install -e '.[fidelity]'"
    pytest.importorskip("torch", reason=why)
    pytest.importorskip("torchvision", reason=why)
    pytest.importorskip("timm", reason=why)
    pytest.importorskip("ultralytics", reason=why)
    return sys.executable


@pytest.fixture(scope="session")
def exported(torch_python):
    """exported(model, exporter) -> the model's ONNX export, made once and cached by the torch,
    torchvision, onnx, timm and ultralytics versions and the export script."""
    said = subprocess.run([torch_python, str(EXPORT), "--versions"], capture_output=True,
                          text=True)
    if said.returncode != 0:
        pytest.fail(f"{torch_python} cannot import torch, torchvision, timm and ultralytics: "
                    f"{said.stderr[-300:]}")
    torch_v, vision_v, onnx_v, timm_v, yolo_v = said.stdout.split()
    digest = hashlib.sha256(f"{said.stdout}\n".encode() + EXPORT.read_bytes()).hexdigest()[:10]
    root = cache_root() / "fidelity" / (f"torch{torch_v}-torchvision{vision_v}-onnx{onnx_v}"
                                         f"-timm{timm_v}-ultralytics{yolo_v}-{digest}")

    def get(model: str, exporter: str) -> Path:
        name = f"{model}-{exporter}"
        path = root / name / f"{name}.onnx"
        if not path.exists():
            root.mkdir(parents=True, exist_ok=True)
            work = Path(tempfile.mkdtemp(dir=root))
            proc = subprocess.run([torch_python, str(EXPORT), model, exporter,
                                   str(work / f"{name}.onnx")], capture_output=True, text=True)
            if proc.returncode != 0:
                shutil.rmtree(work)
                pytest.fail(f"exporting {name} failed: {proc.stderr[-2000:]}")
            try:
                work.rename(root / name)
            except OSError:  # another session exported it first
                shutil.rmtree(work)
        return path

    return get


@pytest.mark.slow
@pytest.mark.cpp
@pytest.mark.parametrize("model, exporter, seed", CASES)
def test_export_runs_like_onnxruntime(tmp_path, monkeypatch, exported, record_property, model,
                                      exporter, seed):
    # A large stage (most of ConvNeXt-Tiny) on a busy shared core can take longer than the 8 s
    # a rank waits for its input by default before it calls the sender dead.
    monkeypatch.setenv("AUTODICE_TIMEOUT_S", "300")
    path = exported(model, exporter)
    graph = load_model(path)
    shape = graph.types[graph.inputs[0]].shape  # 224x224, a timm model's own size, or 320x320
    rng = np.random.default_rng(seed)
    x = (rng.random(shape) if model in DETECTORS else rng.standard_normal(shape))  # YOLO: /255
    x = x.astype(np.float32)
    mapping = random_mapping(path, seed)
    record_property("keys", len(mapping))
    for output, rel in run_distributed(path, mapping, tmp_path, x).items():
        record_property(f"rel {output}", f"{rel:.2e}")



@pytest.mark.slow
@pytest.mark.cpp
@pytest.mark.parametrize("model", TIMM_MODELS)
@pytest.mark.parametrize("exporter", list(OPSETS))
def test_timm_backbones_run_whole_in_ncnn(exported, model, exporter):
    """``layers --check``: every timm backbone, whole on one key, as onnxruntime computes it."""
    found = check_model(exported(model, exporter))
    assert found.runs, f"{found.layer}: {found.problem}"
    assert found.worst <= RTOL


@pytest.mark.slow
@pytest.mark.cpp
@pytest.mark.parametrize("exporter", list(OPSETS))
def test_an_nms_free_yolo_head_is_named_before_any_mapping(exported, exporter):
    """YOLO26 exported with its NMS-free head (Ultralytics' ``nms=False``) picks its 300 boxes
    with TopK and GatherElements, which ncnn has no layers for; Ultralytics' own ncnn export
    turns that head off. ``layers --check`` says so, naming the layer."""
    found = check_model(exported(NMS_FREE, exporter))
    assert not found.runs
    assert "TopK" in found.problem, found.problem
