"""Every input error: one line naming the file, key or layer; exit code 2; nothing written."""

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from graphs import symbolic_model
from onnx import TensorProto, helper, numpy_helper

from autodice.cli import main

FIG2_MAPPING = {"edge01_arm123": ["MaxPool1", "Add1"], "edge01_gpu": ["FC1"],
                "edge04_gpu": ["Conv1", "Relu1"]}


def mapping(**changes):
    """The Figure 2 mapping with keys replaced (value None drops the key)."""
    m = {}
    for k, v in FIG2_MAPPING.items():
        k2 = changes.pop(k, k)
        if k2 is not None:
            m[k2] = v
    m.update(changes)
    return json.dumps(m)


def unsupported_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Loop", ["", "", "r"], ["y"], name="loop",
                              body=helper.make_graph([], "b", [], []))]
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y]))


def argmax_model(cast: bool):
    """x (1x3x4) -> am: ArgMax over channels (int64) [-> y: Cast to float]."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4])
    nodes = [helper.make_node("ArgMax", ["x"], ["am"], name="argmax", axis=1, keepdims=1)]
    if cast:
        nodes.append(helper.make_node("Cast", ["am"], ["y"], name="cast", to=TensorProto.FLOAT))
    y = helper.make_tensor_value_info("y" if cast else "am",
                                      TensorProto.FLOAT if cast else TensorProto.INT64, [1, 1, 4])
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                             opset_imports=[helper.make_opsetid("", 13)])


def dangling_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    w = numpy_helper.from_array(np.ones((1, 4), np.float32), "w")
    nodes = [helper.make_node("Add", ["x", "ghost"], ["y"], name="add")]
    return helper.make_model(helper.make_graph(nodes, "g", [x], [x], [w]))


PLATFORM = open(__file__.replace("tests/test_errors.py", "specs/figure2/platform.txt")).read()

# (case id, files to write {name: text|bytes|model}, extra CLI args, expected text in the error)
CASES = [
    ("unknown-layer", {"mapping.json": mapping(**{"edge04_gpu": None, "edge02_gpu": ["Conv2",
     "Relu1"]})}, [], 'layer "Conv2" is not in'),
    ("did-you-mean", {"mapping.json": mapping(**{"edge04_gpu": None, "edge02_gpu": ["Conv1",
     "Relu_1"]})}, [], 'did you mean "Relu1"'),
    ("unmapped-layer", {"mapping.json": json.dumps({"edge01_arm123": ["MaxPool1", "Add1"],
     "edge01_gpu": ["FC1"], "edge04_gpu": ["Conv1"]})}, [], '"Relu1"'),
    ("layer-split-no-rule", {"mapping.json": json.dumps({**FIG2_MAPPING, "edge02_gpu":
     [{"layer": "FC1", "split": "rows"}]})}, [], 'layer "FC1" cannot be split'),
    ("layer-twice-in-key", {"mapping.json": json.dumps({**FIG2_MAPPING, "edge01_gpu":
     ["FC1", "FC1"]})}, [], 'layer "FC1" is listed twice'),
    ("layer-twice-in-key-and-split", {"mapping.json": json.dumps({**FIG2_MAPPING, "edge01_gpu":
     ["FC1", "FC1"], "edge04_gpu": ["Conv1", "Relu1", "FC1"]})}, [],
     'key "edge01_gpu": layer "FC1" is listed twice'),
    ("key-no-underscore", {"mapping.json": mapping(edge01_gpu="edge01gpu")}, [], '"edge01gpu"'),
    ("key-bad-resource", {"mapping.json": mapping(edge01_gpu="edge01_tpu")}, [], '"tpu"'),
    ("key-unicode-digit", {"mapping.json": mapping(edge01_gpu="edge01_gpu\u0660")}, [],
     'resource "gpu\u0660"'),
    ("unknown-host", {"mapping.json": mapping(edge01_gpu="edge09_gpu")}, [],
     'host "edge09" is not in'),
    ("core-outside-slots", {"mapping.json": mapping(edge01_gpu="edge05_arm5")}, [],
     'core 5 not in the slots of "edge05"'),
    ("core-claimed-twice", {"mapping.json": mapping(edge01_gpu="edge01_arm3")}, [],
     'core 3 of "edge01" is already claimed by key "edge01_arm123"'),
    ("core-digit-twice", {"mapping.json": mapping(edge01_gpu="edge02_arm11")}, [],
     "names a core twice"),
    ("gpu-missing", {"platform.txt": PLATFORM.replace(", gpu=AMDRX6800 (VULKAN)", "")}, [],
     'host "edge04" has no GPU'),
    ("gpu-index", {"mapping.json": mapping(edge01_gpu="edge01_gpu1")}, [], "has one GPU"),
    ("gpu-twice", {"mapping.json": mapping(edge04_gpu="edge01_gpu0")}, [],
     'already used by key "edge01_gpu"'),
    ("arch-mismatch", {"mapping.json": mapping(edge01_gpu="edge04_arm1")}, [],
     "which is x86"),
    ("mapping-not-json", {"mapping.json": '{"edge01_gpu": ['}, [], "not valid JSON"),
    ("mapping-array", {"mapping.json": '["MaxPool1"]'}, [], "expected a non-empty object"),
    ("mapping-empty", {"mapping.json": "{}"}, [], "expected a non-empty object"),
    ("mapping-value", {"mapping.json": '{"edge01_gpu": "FC1"}'}, [],
     'key "edge01_gpu": expected a list'),
    ("mapping-dup-key", {"mapping.json": '{"edge01_gpu": ["FC1"], "edge01_gpu": ["Add1"]}'}, [],
     'key "edge01_gpu" appears twice'),
    ("mapping-missing", {"mapping.json": None}, [], "mapping.json: cannot read"),
    ("platform-unknown-field", {"platform.txt": PLATFORM + "edge06, arm, slots=0-3, ram=4GB\n"},
     [], 'unknown field "ram=4GB"'),
    ("platform-no-slots", {"platform.txt": PLATFORM + "edge06, arm, mem=4GB\n"}, [],
     "slots=... is required"),
    ("platform-bad-arch", {"platform.txt": PLATFORM + "edge06, mips, slots=0\n"}, [],
     'arch "mips"'),
    ("platform-dup-device", {"platform.txt": PLATFORM + "edge01, arm, slots=0\n"}, [],
     'device "edge01" is defined twice'),
    ("platform-backwards-slots", {"platform.txt": PLATFORM + "edge06, arm, slots=5-2\n"}, [],
     "runs backwards"),
    ("platform-bad-mem", {"platform.txt": PLATFORM + "edge06, arm, slots=0, mem=lots\n"}, [],
     "mem=lots"),
    ("platform-short-line", {"platform.txt": PLATFORM + "edge06, arm\n"}, [],
     'expected "name, arch'),
    ("model-missing", {"model.onnx": None}, [], "model.onnx: no such file"),
    ("model-garbage", {"model.onnx": b"\xff\xfe not a model"}, [], "not an ONNX model"),
    ("model-dangling-input", {"model.onnx": dangling_model(), "mapping.json":
     '{"edge01_arm1": ["add"]}'}, [], 'node "add" reads tensor "ghost"'),
    ("unsupported-op", {"model.onnx": unsupported_model(), "mapping.json":
     '{"edge01_arm1": ["relu"], "edge01_arm2": ["loop"]}'}, [],
     'key "edge01_arm2" (rank 1): layer "loop" is a Loop'),
    ("symbolic-cut", {"model.onnx": symbolic_model(), "mapping.json":
     '{"edge01_arm1": ["relu1"], "edge01_arm2": ["relu2"]}'}, [], 'tensor "r" from key'),
    # The program moves float32 only: said at split, not when a rank aborts.
    ("int64-cut", {"model.onnx": argmax_model(cast=True), "mapping.json":
     '{"edge01_arm1": ["argmax"], "edge01_arm2": ["cast"]}'}, [],
     'tensor "am" (int64) would go from rank 0 (edge01_arm1) to another'),
    ("int64-output", {"model.onnx": argmax_model(cast=False), "mapping.json":
     '{"edge01_arm1": ["argmax"]}'}, [], 'output "am" is int64'),
    ("input-shape-unknown", {}, ["--input-shape", "image=1x4x8x8"],
     '--input-shape image: the model has no input "image"'),
    ("input-shape-malformed", {}, ["--input-shape", "input=1,4,8,8"], "expected NAME=DxDx"),
    ("input-shape-rank", {}, ["--input-shape", "input=1x4x8"], "3 dimensions given"),
]


@pytest.mark.parametrize("files, args, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_exits_2_naming_the_culprit(fig2, files, args, expected):
    for name, content in files.items():
        path = fig2 / name
        if content is None:
            path.unlink(missing_ok=True)
        elif isinstance(content, onnx.ModelProto):
            onnx.save(content, path)
        else:
            path.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = sorted(p.name for p in fig2.iterdir())
    result = CliRunner().invoke(main, ["split", str(fig2 / "model.onnx"), "-m",
                                       str(fig2 / "mapping.json"), "-p",
                                       str(fig2 / "platform.txt"), "-o", str(fig2 / "out"), *args])
    assert result.exit_code == 2, result.output
    assert expected in result.output
    assert result.output.startswith("error: ")
    assert sorted(p.name for p in fig2.iterdir()) == before  # no output, no temporary left


def test_every_offender_is_listed_at_once(fig2):
    (fig2 / "mapping.json").write_text(json.dumps({
        "edge01_arm123": ["MaxPool1", "Add1"], "edge09_gpu": ["FC1"], "edge04_tpu": ["Conv1"],
    }))
    result = CliRunner().invoke(main, ["split", str(fig2 / "model.onnx"), "-m",
                                       str(fig2 / "mapping.json"), "-p",
                                       str(fig2 / "platform.txt"), "-o", str(fig2 / "out")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 2 and "edge09" in lines[0] and "tpu" in lines[1]


def test_every_files_problems_are_said_at_once(fig2):
    """The platform, the mapping and the model are read one after another: each one's problems
    are said, not only the first file's."""
    (fig2 / "platform.txt").write_text("edge01, arm, slots=x\n")
    (fig2 / "mapping.json").write_text("{not json")
    (fig2 / "model.onnx").unlink()
    result = CliRunner().invoke(main, ["split", str(fig2 / "model.onnx"), "-m",
                                       str(fig2 / "mapping.json"), "-p",
                                       str(fig2 / "platform.txt"), "-o", str(fig2 / "out")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 3 and "platform.txt:1" in lines[0] and "mapping.json: not valid JSON" \
        in lines[1] and "model.onnx: no such file" in lines[2], lines


def test_refuses_to_replace_a_foreign_directory(fig2):
    (fig2 / "out").mkdir()
    (fig2 / "out" / "thesis.tex").write_text("years of work")
    result = CliRunner().invoke(main, ["split", str(fig2 / "model.onnx"), "-m",
                                       str(fig2 / "mapping.json"), "-p",
                                       str(fig2 / "platform.txt"), "-o", str(fig2 / "out")])
    assert result.exit_code == 2 and "not an autodice output directory" in result.output
    assert (fig2 / "out" / "thesis.tex").read_text() == "years of work"


def test_the_current_folder_is_not_an_output(fig2, monkeypatch):
    here = fig2 / "empty"
    here.mkdir()
    monkeypatch.chdir(here)
    for out in (".", ".."):
        result = CliRunner().invoke(main, ["split", str(fig2 / "model.onnx"), "-m",
                                           str(fig2 / "mapping.json"), "-p",
                                           str(fig2 / "platform.txt"), "-o", out])
        assert result.exit_code == 2 and "cannot be an output" in result.output, result.output
    assert not list(here.iterdir()) and sorted(p.name for p in fig2.iterdir()) == [
        "empty", "mapping.json", "model.onnx", "platform.txt"]


def test_symbolic_shapes_are_fine_with_input_shape(fig2):
    onnx.save(symbolic_model(), fig2 / "model.onnx")
    (fig2 / "mapping.json").write_text('{"edge01_arm1": ["relu1"], "edge01_arm2": ["relu2"]}')
    result = CliRunner().invoke(main, ["split", str(fig2 / "model.onnx"), "-m",
                                       str(fig2 / "mapping.json"), "-p",
                                       str(fig2 / "platform.txt"), "-o", str(fig2 / "out"),
                                       "--input-shape", "x=1x4x5x7", "--check"])
    assert result.exit_code == 0, result.output
    assert "check y: max abs 0" in result.output


@pytest.mark.parametrize("frame, expected", [
    ("missing.png", "--verify-with {d}/missing.png: no such image"),
    ("wrong.npy", "--verify-with {d}/wrong.npy"),
])
def test_a_frame_to_verify_with_that_cannot_be_used_is_one_line(fig2, frame, expected):
    np.save(fig2 / "wrong.npy", np.zeros((2, 3), np.float32))
    result = CliRunner().invoke(main, ["split", str(fig2 / "model.onnx"), "-m",
                                       str(fig2 / "mapping.json"), "-p",
                                       str(fig2 / "platform.txt"), "-o", str(fig2 / "out")])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(main, ["gen", str(fig2 / "out"), "--verify-with",
                                       str(fig2 / frame)])
    lines = [ln for ln in result.output.splitlines() if ln.startswith("error:")]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert expected.format(d=fig2) in lines[0]
    assert not (fig2 / "out" / "ncnn").exists() and not (fig2 / "out" / "packages").exists()
