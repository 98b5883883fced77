"""Malformed inputs, one table: every verb, every file a user brings.

Each case writes a few files over the Figure 2 example (or over a split of it), runs one command
line and expects exit code 2, one ``error:`` line per problem naming the culprit (file, key,
node, field or option), no traceback, and the work folder exactly as it was: no output, no
temporary folder, no file outside the output read into it or removed. ``test_errors.py`` holds
the older split cases; this table adds the other verbs and the inputs that used to crash,
hang, wipe a folder or pass silently.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from graphs import figure2, symbolic_model
from onnx import TensorProto, helper, numpy_helper
from test_cost import fixture_profile

from autodice.cli import main
from autodice.core.model import load_model
from autodice.dse.profile import profile_to_json
from autodice.frontend.split import split

SPLIT = "split {d}/model.onnx -m {d}/mapping.json -p {d}/platform.txt -o {d}/out"
DSE = "dse {d}/model.onnx -p {d}/platform.txt --profile {d}/profile.json -o {d}/front --pop 8 " \
      "--gens 2"
PROFILE = "profile {d}/model.onnx -p {d}/platform.txt -o {d}/profile.out.json"
DEPLOY = "deploy {d}/out -i {d}/inventory.toml"
INVENTORY = """\
[defaults]
user = "root"
remote_dir = "/home/root/autodice"

[hosts.edge01]
address = "10.77.0.11"

[hosts.edge04]
address = "10.77.0.14"
"""


# --- models -----------------------------------------------------------------------------------


def fig2_with(edit) -> onnx.ModelProto:
    """Figure 2 (tests/graphs.py) after ``edit(model)``."""
    m = figure2()
    edit(m)
    return m


def initializer(m: onnx.ModelProto, name: str) -> onnx.TensorProto:
    return next(t for t in m.graph.initializer if t.name == name)


def external(location: str | None, offset: str | None = None, length: str | None = None):
    """Figure 2 with ``w_fc`` (64 bytes) stored as external data at ``location``."""
    def edit(m):
        t = initializer(m, "w_fc")
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", offset), ("length", length)):
            if value is not None:
                entry = t.external_data.add()
                entry.key, entry.value = key, value
    return fig2_with(edit)


def wrong_conv_weights(m):
    """Conv1 reads 4 channels; its weights say 3."""
    initializer(m, "w_conv").CopyFrom(
        numpy_helper.from_array(np.ones((4, 3, 1, 1), np.float32), "w_conv"))


def wrong_matmul_weights(m):
    """FC1 multiplies ...x8 by a 5x4 matrix."""
    initializer(m, "w_fc").CopyFrom(numpy_helper.from_array(np.ones((5, 4), np.float32), "w_fc"))


def short_raw_data(m):
    """w_conv's dims say 64 bytes; raw_data holds 8."""
    initializer(m, "w_conv").raw_data = b"\0" * 8


def unknown_op(m):
    m.graph.node[4].op_type = "FooBar"


def two_producers(m):
    m.graph.node.append(helper.make_node("Relu", ["input"], ["Buff1"], name="Again"))


def ghost_output(m):
    m.graph.output.append(helper.make_tensor_value_info("ghost", TensorProto.FLOAT, [1]))


def empty_graph(m):
    del m.graph.node[:]


def bad_attribute(m):
    m.graph.node[0].attribute[0].CopyFrom(helper.make_attribute("kernel_shape", [2, 2, 2]))


def negative_dims(m):
    t = initializer(m, "w_fc")
    t.dims[:] = [-1, 4]


def huge_initializer(m):
    """dims of 2^40 x 2^40 with a few bytes of payload."""
    t = initializer(m, "w_fc")
    t.dims[:] = [2**40, 2**40]


def many_dangling(m):
    """100 nodes that each read a tensor nothing provides."""
    m.graph.node.extend(helper.make_node("Relu", [f"ghost{k}"], [f"g{k}"], name=f"G{k}")
                        for k in range(100))


def huge_declared_input(m):
    """The model itself says its input is 1x4x2147483648x8 (2^36 elements)."""
    dims = m.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_value = 2**31
    m.graph.output[0].type.tensor_type.ClearField("shape")


SYMBOLIC_MAPPING = '{"edge01_arm1": ["relu1"], "edge01_arm2": ["relu2"]}'


# --- plans: a split of Figure 2, edited by hand -------------------------------------------------


def plan_edit(edit):
    """A setup that applies ``edit(plan_dict)`` to ``out/plan.json`` (``edit`` may return a
    replacement)."""
    def setup(d: Path):
        path = d / "out" / "plan.json"
        data = json.loads(path.read_text())
        data = edit(data) or data
        path.write_text(json.dumps(data))
    return setup


def set_path(path: str, value):
    """An edit that sets ``data[a][b]...`` for ``path`` "a.b..." (list indexes as numbers)."""
    def edit(data):
        *head, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        obj = data
        for p in head:
            obj = obj[p]
        if value is DELETE:
            del obj[last]
        else:
            obj[last] = value
    return edit


DELETE = object()


def symlink(target: str, name: str):
    def setup(d: Path):
        os.symlink(target, d / name)
    return setup


def foreign_folder(name: str, marker: str):
    """A folder of the user's holding ``marker`` (a file autodice outputs hold) and their work."""
    def setup(d: Path):
        (d / name).mkdir()
        (d / name / marker).write_text("{}")
        (d / name / "keep.txt").write_text("precious")
    return setup


def forged_manifest(d: Path):
    """A manifest that claims a file outside its folder, beside a file of the user's."""
    (d / "out").mkdir()
    (d / "out" / ".autodice-output").write_text("../model.onnx\nkeep.txt/../../x\n")
    (d / "out" / "keep.txt").write_text("precious")


def fake_program(d: Path):
    """What ``build`` leaves for ``run`` to find (``run`` checks its inputs before starting it)."""
    program = d / "out" / "packages" / "edge01" / "build" / "program"
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\nexit 3\n")
    manifest = d / "out" / ".autodice-output"
    manifest.write_text(manifest.read_text() + "packages/\n")


def npy(shape, dtype=np.float32) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, np.zeros(shape, dtype))
    return buf.getvalue()


def nested(depth: int, kind: str = "json") -> str:
    return "[" * depth + "]" * depth if kind == "json" else "a = " + "[" * depth + "]" * depth


def profile_json(d: Path, edit=None) -> str:
    data = profile_to_json(fixture_profile(load_model(d / "model.onnx")))
    if edit:
        data = edit(data) or data
    return json.dumps(data)


def profile_edit(edit):
    def setup(d: Path):
        (d / "profile.json").write_text(profile_json(d, edit))
    return setup


PLATFORM = (Path(__file__).parent.parent / "specs" / "figure2" / "platform.txt").read_text()
MAPPING = (Path(__file__).parent.parent / "specs" / "figure2" / "mapping.json").read_text()
BIG_MAPPING = json.dumps({f"edge{k:05d}_cpu{k}": ["Conv1"] for k in range(10_000)})


# (id, base, files {path: text | bytes | model | None (delete) | setup(d)}, command, expected)
# base "fig2": model.onnx, mapping.json, platform.txt; "split": plus a split of them in out/.
CASES = [
    # -- platform.txt ---------------------------------------------------------------------------
    ("platform-not-utf8", "fig2", {"platform.txt": b"edge01, arm, slots=0-5 \xff\xfe\n"}, SPLIT,
     "platform.txt: not UTF-8 text"),
    ("platform-binary", "fig2", {"platform.txt": bytes(range(256))}, SPLIT,
     "platform.txt: not UTF-8 text"),
    ("platform-empty", "fig2", {"platform.txt": ""}, SPLIT, "platform.txt: no devices defined"),
    ("platform-only-comments", "fig2", {"platform.txt": "# nothing\n   # here\n"}, SPLIT,
     "platform.txt: no devices defined"),
    ("platform-slots-bomb", "fig2",
     {"platform.txt": PLATFORM + "edge06, arm, slots=0-9999999999\n"}, SPLIT,
     "slots=0-9999999999: core 9999999999 is past 4095"),
    ("platform-slots-list-bomb", "fig2",
     {"platform.txt": PLATFORM + "edge06, arm, slots=1,3,99999999999999999999\n"}, SPLIT,
     "core 99999999999999999999 is past 4095"),
    ("platform-slots-negative", "fig2", {"platform.txt": PLATFORM + "edge06, arm, slots=-1\n"},
     SPLIT, 'device "edge06": slots=-1'),
    ("platform-slots-empty", "fig2", {"platform.txt": PLATFORM + "edge06, arm, slots=\n"}, SPLIT,
     'device "edge06": slots=: ""'),
    ("platform-slots-list-twice", "fig2",
     {"platform.txt": PLATFORM + "edge06, arm, slots=1,3,3\n"}, SPLIT, "names a core twice"),
    ("platform-field-twice", "fig2",
     {"platform.txt": PLATFORM + "edge06, arm, slots=0-1, mem=1GB, mem=2GB\n"}, SPLIT,
     'device "edge06": field "mem" is given twice'),
    ("platform-mem-zero", "fig2", {"platform.txt": PLATFORM + "edge06, arm, slots=0, mem=0GB\n"},
     SPLIT, 'device "edge06": mem=0GB: must be more than 0'),
    ("platform-bandwidth-zero", "fig2",
     {"platform.txt": PLATFORM + "edge06, arm, slots=0, bandwidth=0gbit\n"}, SPLIT,
     "bandwidth=0gbit: must be more than 0"),
    ("platform-power-negative", "fig2",
     {"platform.txt": PLATFORM + "edge06, arm, slots=0, power_cpu=-1W\n"}, SPLIT,
     "power_cpu=-1W"),
    ("platform-latency-unit", "fig2",
     {"platform.txt": PLATFORM + "edge06, arm, slots=0, latency=3 fortnights\n"}, SPLIT,
     "latency=3 fortnights"),
    ("platform-empty-name", "fig2", {"platform.txt": PLATFORM + ", arm, slots=0\n"}, SPLIT,
     'device name "" must be'),
    ("platform-bad-name", "fig2", {"platform.txt": PLATFORM + "edge 06, arm, slots=0\n"}, SPLIT,
     'device name "edge 06" must be'),
    ("platform-only-commas", "fig2", {"platform.txt": PLATFORM + ",,,\n"}, SPLIT,
     "platform.txt:7"),
    ("platform-stray-value", "fig2", {"platform.txt": PLATFORM + "edge06, arm, 0-3\n"}, SPLIT,
     'unknown field "0-3"'),
    ("platform-missing", "fig2", {"platform.txt": None}, SPLIT, "platform.txt: cannot read"),
    ("platform-is-dir", "fig2", {"pdir": lambda d: (d / "pdir").mkdir()},
     SPLIT.replace("-p {d}/platform.txt", "-p {d}/pdir"), "is a directory"),
    # -- mapping.json ---------------------------------------------------------------------------
    ("mapping-not-utf8", "fig2", {"mapping.json": b'{"edge01_gpu": ["FC1\xff"]}'}, SPLIT,
     "mapping.json: not UTF-8 text"),
    ("mapping-nested", "fig2", {"mapping.json": nested(100_000)}, SPLIT,
     "mapping.json: nested too deeply"),
    ("mapping-nested-object", "fig2", {"mapping.json": '{"a": ' * 50_000 + "1" + "}" * 50_000},
     SPLIT, "mapping.json: nested too deeply"),
    ("mapping-key-core-bomb", "fig2",
     {"mapping.json": '{"edge01_cpu0-99999999999": ["MaxPool1", "Conv1", "FC1", "Add1", '
      '"Relu1"]}'}, SPLIT, 'key "edge01_cpu0-99999999999": core 99999999999 is past 4095'),
    ("mapping-empty-key-list", "fig2",
     {"mapping.json": json.dumps({**json.loads(MAPPING), "edge02_gpu": []})}, SPLIT,
     'key "edge02_gpu": lists no layers'),
    ("mapping-null-value", "fig2", {"mapping.json": '{"edge01_gpu": null}'}, SPLIT,
     'key "edge01_gpu": expected a list'),
    ("mapping-number-layer", "fig2", {"mapping.json": '{"edge01_gpu": [1, 2]}'}, SPLIT,
     'key "edge01_gpu": 1 is neither a layer name'),
    ("mapping-nested-layer", "fig2", {"mapping.json": '{"edge01_gpu": [["FC1"]]}'}, SPLIT,
     'key "edge01_gpu": ["FC1"] is neither a layer name'),
    ("mapping-string", "fig2", {"mapping.json": '"edge01_gpu"'}, SPLIT,
     "mapping.json: expected a non-empty object"),
    ("mapping-null", "fig2", {"mapping.json": "null"}, SPLIT,
     "mapping.json: expected a non-empty object"),
    ("mapping-empty-file", "fig2", {"mapping.json": ""}, SPLIT, "mapping.json: not valid JSON"),
    ("mapping-nan", "fig2", {"mapping.json": '{"edge01_gpu": NaN}'}, SPLIT,
     'key "edge01_gpu": expected a list'),
    ("mapping-empty-key", "fig2", {"mapping.json": '{"": ["FC1"]}'}, SPLIT,
     'key "": expected <host>_<resource>'),
    ("mapping-no-host", "fig2", {"mapping.json": '{"_gpu": ["FC1"]}'}, SPLIT,
     'key "_gpu": expected <host>_<resource>'),
    ("mapping-ten-thousand-keys", "fig2", {"mapping.json": BIG_MAPPING}, SPLIT,
     "more keys whose host is not in"),
    ("mapping-key-newline", "fig2", {"mapping.json": json.dumps({"edge01\nerror: fake_gpu":
                                                                  ["FC1"]})}, SPLIT,
     'host "edge01\\nerror: fake" is not in'),
    ("mapping-key-escape", "fig2", {"mapping.json": json.dumps({"edge01\x1b[2J_gpu": ["FC1"]})},
     SPLIT, 'host "edge01\\x1b[2J" is not in'),
    ("mapping-huge-number", "fig2", {"mapping.json": '{"edge01_gpu": [' + "9" * 5000 + "]}"},
     SPLIT, "mapping.json: holds a number too long to read"),
    ("mapping-gpu-index-huge", "fig2", {"mapping.json": '{"edge01_gpu' + "9" * 5000 +
                                        '": ["FC1"]}'}, SPLIT, "no host has that many GPUs"),
    ("mapping-dev-zero", "fig2", {}, SPLIT.replace("{d}/mapping.json", "/dev/zero"),
     "/dev/zero: larger than 64 MiB"),
    ("platform-dev-urandom", "fig2", {}, SPLIT.replace("{d}/platform.txt", "/dev/urandom"),
     "/dev/urandom: larger than 64 MiB"),
    ("platform-slots-digits", "fig2",
     {"platform.txt": PLATFORM + "edge06, arm, slots=0-" + "9" * 5000 + "\n"}, SPLIT,
     "is past 4095"),
    ("mapping-many-twice", "fig2",
     {"mapping.json": "{" + ", ".join(['"edge01_gpu": ["FC1"]'] * 1000) + "}"}, SPLIT,
     "mapping.json: and 979 more keys that appear twice"),
    ("mapping-missing-dir", "fig2", {"mapping.json": lambda d: (d / "mapping.json").unlink()},
     SPLIT.replace("-m {d}/mapping.json", "-m {d}/nowhere/mapping.json"),
     "nowhere/mapping.json: cannot read"),
    # -- the model ------------------------------------------------------------------------------
    ("external-data-dotdot", "fig2", {"model.onnx": external("../../../../etc/passwd")}, SPLIT,
     'initializer "w_fc": external data "../../../../etc/passwd" is outside the model\'s folder'),
    ("external-data-absolute", "fig2", {"model.onnx": external("/etc/passwd")}, SPLIT,
     'initializer "w_fc": external data "/etc/passwd" is outside the model\'s folder'),
    ("external-data-symlink", "fig2", {"w.bin": symlink("/etc/passwd", "w.bin"),
                                       "model.onnx": external("w.bin")}, SPLIT,
     'initializer "w_fc": external data "w.bin" is outside the model\'s folder'),
    ("external-data-symlinked-dir", "fig2", {"etc": symlink("/etc", "etc"),
                                             "model.onnx": external("etc/passwd")}, SPLIT,
     'initializer "w_fc": external data "etc/passwd" is outside the model\'s folder'),
    ("external-data-missing", "fig2", {"model.onnx": external("w.bin")}, SPLIT,
     'initializer "w_fc": external data "w.bin": no such file'),
    ("external-data-dir", "fig2", {"w.bin": lambda d: (d / "w.bin").mkdir(),
                                   "model.onnx": external("w.bin")}, SPLIT,
     'initializer "w_fc": external data "w.bin" is not a file'),
    ("external-data-short", "fig2", {"w.bin": b"\0" * 16, "model.onnx": external("w.bin")},
     SPLIT, 'initializer "w_fc": external data "w.bin" holds 16 bytes'),
    ("external-data-offset", "fig2", {"w.bin": b"\0" * 64,
                                      "model.onnx": external("w.bin", offset="abc")}, SPLIT,
     'initializer "w_fc": external data offset "abc" is not a whole number'),
    ("external-data-length", "fig2", {"w.bin": b"\0" * 64,
                                      "model.onnx": external("w.bin", length="-5")}, SPLIT,
     'initializer "w_fc": external data length "-5" is not a whole number'),
    ("external-data-no-location", "fig2", {"model.onnx": external(None)}, SPLIT,
     'initializer "w_fc": external data has no location'),
    ("model-empty-graph", "fig2", {"model.onnx": fig2_with(empty_graph)}, SPLIT,
     "model.onnx: the graph has no nodes"),
    ("model-unknown-op", "fig2", {"model.onnx": fig2_with(unknown_op)}, SPLIT,
     'node "Relu1": op "FooBar" is unknown to ONNX'),
    ("model-wrong-conv-weights", "fig2", {"model.onnx": fig2_with(wrong_conv_weights)}, SPLIT,
     'node "Conv1"'),
    ("model-wrong-matmul-weights", "fig2", {"model.onnx": fig2_with(wrong_matmul_weights)},
     SPLIT, 'node "FC1"'),
    ("model-short-raw-data", "fig2", {"model.onnx": fig2_with(short_raw_data)}, SPLIT,
     'initializer "w_conv" holds 8 bytes'),
    ("model-two-producers", "fig2", {"model.onnx": fig2_with(two_producers)}, SPLIT,
     'tensor "Buff1" is the output of both node "MaxPool1" and node "Again"'),
    ("model-ghost-output", "fig2", {"model.onnx": fig2_with(ghost_output)}, SPLIT,
     'output "ghost" is not produced by any node'),
    ("model-bad-attribute", "fig2", {"model.onnx": fig2_with(bad_attribute)}, SPLIT,
     'node "MaxPool1"'),
    ("model-negative-dims", "fig2", {"model.onnx": fig2_with(negative_dims)}, SPLIT,
     'initializer "w_fc"'),
    ("model-huge-initializer", "fig2", {"model.onnx": fig2_with(huge_initializer)}, SPLIT,
     'initializer "w_fc"'),
    ("model-op-name-control", "fig2",
     {"model.onnx": fig2_with(lambda m: setattr(m.graph.node[4], "op_type", "Foo\nBar"))},
     SPLIT, 'op "Foo\\nBar" is unknown to ONNX'),
    ("model-huge-declared-input", "fig2", {"model.onnx": fig2_with(huge_declared_input)}, SPLIT,
     'tensor "input" would hold 68719476736 elements'),
    ("model-many-dangling", "fig2", {"model.onnx": fig2_with(many_dangling)}, SPLIT,
     "model.onnx: and 80 more tensors read but never provided"),
    ("model-empty-file", "fig2", {"model.onnx": b""}, SPLIT, "model.onnx: not an ONNX model"),
    ("model-truncated", "fig2", {"model.onnx": lambda d: (d / "model.onnx").write_bytes(
        figure2().SerializeToString()[:150])}, SPLIT, "model.onnx: not an ONNX model"),
    ("model-text", "fig2", {"model.onnx": "ir_version: 8\ngraph { }\n"}, SPLIT,
     "model.onnx: not an ONNX model"),
    ("model-is-dir", "fig2", {"model.onnx": None, "m": lambda d: (d / "m").mkdir()},
     SPLIT.replace("{d}/model.onnx", "{d}/m"), "is a directory"),
    # -- --input-shape --------------------------------------------------------------------------
    ("input-shape-huge", "fig2", {}, SPLIT + " --input-shape input=1x4x1099511627776x1099511627776",
     'tensor "input"'),
    ("input-shape-huge-symbolic", "fig2", {"model.onnx": symbolic_model(),
                                           "mapping.json": SYMBOLIC_MAPPING},
     SPLIT + " --input-shape x=1x4x1099511627776x1099511627776", 'tensor "x"'),
    ("input-shape-past-int64", "fig2", {}, SPLIT + " --input-shape "
     "input=1x4x99999999999999999999999x1", "--input-shape input=1x4x99999999999999999999999x1"),
    ("input-shape-digits", "fig2", {}, SPLIT + " --input-shape input=1x4x" + "9" * 5000 + "x1",
     'tensor "input" has a dimension past 2^31'),
    ("input-shape-zero", "fig2", {}, SPLIT + " --input-shape input=1x4x0x8",
     '--input-shape "input=1x4x0x8": dimensions must be at least 1'),
    ("input-shape-twice", "fig2", {}, SPLIT + " --input-shape input=1x4x8x8 --input-shape "
     "input=1x4x4x4", '--input-shape input: given twice'),
    ("input-shape-empty-name", "fig2", {}, SPLIT + " --input-shape =1x4x8x8",
     'expected NAME=DxDx'),
    ("input-shape-symbolic-huge-one", "fig2", {"model.onnx": symbolic_model(),
                                               "mapping.json": SYMBOLIC_MAPPING},
     SPLIT + " --input-shape x=1x4x65536x65536", 'tensor "x"'),
    # -- the output directory -------------------------------------------------------------------
    ("output-plan-json-not-ours", "fig2", {"out": foreign_folder("out", "plan.json")}, SPLIT,
     "out: exists and is not an autodice output directory"),
    ("output-pareto-json-not-ours", "fig2",
     {"profile.json": profile_json, "front": foreign_folder("front", "pareto.json")}, DSE,
     "front: exists and is not an autodice output directory"),
    ("output-user-file-inside", "split", {"out/notes.txt": "my notes"}, SPLIT,
     "notes.txt"),
    ("output-forged-manifest", "fig2", {"out": forged_manifest}, SPLIT,
     "out: exists and is not an autodice output directory"),
    ("output-parent-is-file", "fig2", {"afile": "x"}, SPLIT.replace("{d}/out", "{d}/afile/out"),
     "afile/out: cannot write"),
    ("output-is-file", "fig2", {"out": "x"}, SPLIT, "out' is a file"),
    ("output-in-proc", "fig2", {}, SPLIT.replace("{d}/out", "/proc/autodice-out"),
     "/proc/autodice-out: cannot write"),
    ("output-in-sys", "fig2", {}, SPLIT.replace("{d}/out", "/sys/autodice/out"),
     "/sys/autodice/out: cannot write"),
    ("output-symlink", "fig2", {"elsewhere": lambda d: (d / "elsewhere").mkdir() or
                                (d / "elsewhere" / "f").write_text("x"),
                                "out": symlink("elsewhere", "out")}, SPLIT,
     "out: exists and is not an autodice output directory"),
    ("output-is-model-folder", "fig2", {}, SPLIT.replace("-o {d}/out", "-o {d}"),
     "exists and is not an autodice output directory"),
    # -- plan.json, edited by hand (gen, build, run, check, view, deploy read it) ---------------
    ("plan-missing-key", "split", {"plan": plan_edit(set_path("ranks.0.submodel", DELETE))},
     "gen {d}/out", 'plan.json: ranks[0]: "submodel" is missing'),
    ("plan-submodel-escapes", "split",
     {"plan": plan_edit(set_path("ranks.0.submodel", "../../../../etc/passwd"))}, "gen {d}/out",
     'plan.json: ranks[0].submodel "../../../../etc/passwd" is not a path inside the output'),
    ("plan-submodel-absolute", "split",
     {"plan": plan_edit(set_path("ranks.1.submodel", "/etc/passwd"))}, "check {d}/out",
     'plan.json: ranks[1].submodel "/etc/passwd" is not a path inside the output'),
    ("plan-host-injection", "split",
     {"plan": plan_edit(set_path("ranks.0.host", "edge01; rm -rf ~"))}, "gen {d}/out",
     'plan.json: ranks[0].host "edge01; rm -rf ~"'),
    ("plan-key-unparseable", "split", {"plan": plan_edit(set_path("ranks.0.key", "edge01"))},
     "gen {d}/out", 'plan.json: ranks[0].key "edge01"'),
    ("plan-rank-numbers", "split", {"plan": plan_edit(set_path("ranks.1.rank", 7))},
     "build {d}/out", "plan.json: ranks[1].rank is 7"),
    ("plan-wrong-type", "split", {"plan": plan_edit(set_path("ranks.0.threads", "many"))},
     "gen {d}/out", "plan.json: ranks[0].threads"),
    ("plan-threads-zero", "split", {"plan": plan_edit(set_path("ranks.0.threads", 0))},
     "gen {d}/out", "plan.json: ranks[0].threads"),
    ("plan-slots-bomb", "split", {"plan": plan_edit(set_path("ranks.0.slots", [99999999999]))},
     "gen {d}/out", "plan.json: ranks[0].slots"),
    ("plan-negative-shape", "split",
     {"plan": plan_edit(set_path("model_inputs.0.shape", [1, -4, 8, 8]))}, "check {d}/out",
     "plan.json: model_inputs[0].shape"),
    ("plan-dtype", "split", {"plan": plan_edit(set_path("model_inputs.0.dtype", "float99"))},
     "check {d}/out", 'plan.json: model_inputs[0].dtype "float99"'),
    ("plan-unknown-tag", "split", {"plan": plan_edit(set_path("ranks.1.recv.0.tag", 999))},
     "gen {d}/out", "plan.json: ranks[1].recv[0]: tag 999"),
    ("plan-ranks-not-list", "split", {"plan": plan_edit(set_path("ranks", "three"))},
     "gen {d}/out", "plan.json: ranks"),
    ("plan-no-ranks", "split", {"plan": plan_edit(set_path("ranks", []))}, "build {d}/out",
     "plan.json: ranks"),
    ("plan-is-list", "split", {"plan": plan_edit(lambda data: [data])}, "gen {d}/out",
     "plan.json: expected an object"),
    ("plan-version", "split", {"plan": plan_edit(set_path("version", DELETE))}, "gen {d}/out",
     "plan.json: plan version None is not 1"),
    ("plan-not-utf8", "split", {"out/plan.json": b'{"version": 1, "model": "\xff"}'},
     "gen {d}/out", "plan.json: not UTF-8 text"),
    ("plan-nested", "split", {"out/plan.json": nested(100_000)}, "gen {d}/out",
     "plan.json: nested too deeply"),
    ("plan-huge-number", "split", {"out/plan.json": '{"version": ' + "1" * 5000 + "}"},
     "gen {d}/out", "plan.json: holds a number too long to read"),
    ("plan-self-send", "split", {"plan": plan_edit(set_path("edges.0.to", [0]))},
     "gen {d}/out", "plan.json"),
    ("plan-deadlock", "split", {"plan": plan_edit(lambda p: p["ranks"][0]["steps"].insert(
        0, {"wait": ["Buff2"], "extract": []}))}, "check {d}/out", "plan.json"),
    ("plan-rank-input", "split", {"plan": plan_edit(set_path("ranks.0.inputs", ["Buff3"]))},
     "gen {d}/out", "plan.json: rank 0 reads inputs that are not the model's"),
    ("plan-edge-shape", "split", {"plan": plan_edit(set_path("edges.1.shape", [1, 4, 2, 8]))},
     "gen {d}/out", "plan.json: rank"),
    ("plan-duplicate-key", "split", {"plan": plan_edit(set_path("ranks.1.key", "edge01_arm123"))},
     "gen {d}/out", 'ranks[1].key "edge01_arm123" is the key of another rank too'),
    ("plan-view", "split", {"plan": plan_edit(set_path("ranks.0.layers", "MaxPool1"))},
     "view {d}/out -o {d}/p.svg", "plan.json: ranks[0].layers"),
    ("plan-deploy", "split", {"plan": plan_edit(set_path("ranks.0.host", "-oProxyCommand=x")),
                              "inventory.toml": INVENTORY}, DEPLOY,
     'plan.json: ranks[0].host "-oProxyCommand=x"'),
    ("plan-derived", "split", {"plan": plan_edit(set_path("derived", []))}, "gen {d}/out",
     "plan.json: derived: expected an object"),
    ("plan-derived-share", "split", {"plan": plan_edit(set_path("derived", {"p": ["FC1", 7]}))},
     "gen {d}/out", "plan.json: derived: expected an object"),
    ("plan-replicas-type", "split", {"plan": plan_edit(set_path("ranks.0.replicas", ["a"]))},
     "gen {d}/out", "plan.json: ranks[0].replicas: expected a list of whole numbers"),
    ("plan-replicas-range", "split", {"plan": plan_edit(set_path("ranks.0.replicas", [0, 99]))},
     "view {d}/out -o {d}/p.svg", "plan.json: rank 0: its stage's ranks [0, 99] are not"),
    ("plan-tags", "split", {"plan": plan_edit(lambda p: p["edges"][0].update(tag=100))},
     "gen {d}/out", "plan.json: edges: tags must be 0 to"),
    ("plan-run", "split", {"plan": plan_edit(set_path("model_inputs.0.name", 5))},
     "run {d}/out --input {d}/x.npy", "plan.json: model_inputs[0].name"),
    ("plan-without-manifest", "split", {"out/.autodice-output": None}, "gen {d}/out",
     "out: not an autodice output directory"),
    # -- gen, build, run, check -----------------------------------------------------------------
    ("gen-submodel-missing", "split", {"out/models/edge04_gpu.onnx": None}, "gen {d}/out",
     "models/edge04_gpu.onnx: no such file"),
    ("gen-no-plan", "fig2", {}, "gen {d}", "no plan here"),
    ("gen-submodel-garbage", "split", {"out/models/edge04_gpu.onnx": b"garbage"},
     "gen {d}/out", 'key "edge04_gpu"'),
    ("build-no-packages", "split", {}, "build {d}/out", "no packages"),
    ("run-input-name", "split", {"x.npy": npy((1, 4, 8, 8))}, "run {d}/out --input nope={d}/x.npy",
     "--input nope="),
    ("run-input-missing", "split", {"out/packages": fake_program},
     "run {d}/out --input {d}/nope.npy", "nope.npy: cannot read it (No such file"),
    ("run-input-not-npy", "split", {"out/packages": fake_program, "x.npy": "hello"},
     "run {d}/out --input {d}/x.npy", "x.npy: not a .npy array"),
    ("run-input-shape", "split", {"out/packages": fake_program, "x.npy": npy((1, 4, 4, 4))},
     "run {d}/out --input {d}/x.npy", 'model input "input" must be 1x4x8x8 float32'),
    ("run-input-dtype", "split", {"out/packages": fake_program,
                                  "x.npy": npy((1, 4, 8, 8), np.float64)},
     "run {d}/out --input {d}/x.npy", 'model input "input" must be 1x4x8x8 float32'),
    ("run-frames-zero", "split", {"out/packages": fake_program, "x.npy": npy((1, 4, 8, 8))},
     "run {d}/out --input {d}/x.npy --frames 0", "--frames 0"),
    ("run-results-is-file", "split", {"out/packages": fake_program, "x.npy": npy((1, 4, 8, 8)),
                                      "r": "x"},
     "run {d}/out --input {d}/x.npy --results {d}/r", "r' is a file"),
    ("run-results-in-file", "split", {"out/packages": fake_program, "x.npy": npy((1, 4, 8, 8)),
                                      "r": "x"},
     "run {d}/out --input {d}/x.npy --results {d}/r/s", "r/s: cannot write"),
    ("run-input-dev-zero", "split", {"out/packages": fake_program},
     "run {d}/out --input /dev/zero", "/dev/zero: not a .npy array (no .npy header"),
    ("run-frames-type", "split", {}, "run {d}/out --input {d}/x.npy --frames many",
     "'--frames'"),
    ("check-samples-zero", "split", {}, "check {d}/out --samples 0", "--samples 0"),
    ("check-model-missing", "split", {}, "check {d}/out --model {d}/nope.onnx",
     "nope.onnx: the whole model is not there"),
    ("check-other-model", "split", {"other.onnx": symbolic_model()},
     "check {d}/out --model {d}/other.onnx", "other.onnx: not the model that was split"),
    ("check-submodel-garbage", "split", {"out/models/edge04_gpu.onnx": b"garbage"},
     "check {d}/out", "edge04_gpu.onnx"),
    ("split-check-samples", "fig2", {}, SPLIT + " --check --samples 0", "--samples 0"),
    ("view-bad-extension", "split", {}, "view {d}/out -o {d}/p.bmp", "p.bmp"),
    ("view-unwritable", "split", {"afile": "x"}, "view {d}/out -o {d}/afile/p.svg",
     "afile/p.svg: cannot write"),
    ("zoo-unknown", "fig2", {}, "zoo nosuchnet -o {d}/z.onnx", "nosuchnet"),
    # -- layers ---------------------------------------------------------------------------------
    ("layers-garbage", "fig2", {"model.onnx": b"\x08\x01garbage"}, "layers {d}/model.onnx",
     "model.onnx: not an ONNX model"),
    ("layers-external-dotdot", "fig2", {"model.onnx": external("../../../../etc/passwd")},
     "layers {d}/model.onnx", "is outside the model's folder"),
    ("layers-balance-empty", "fig2", {}, "layers {d}/model.onnx --balance ,",
     "--balance"),
    ("layers-balance-bad-key", "fig2", {}, "layers {d}/model.onnx --balance edge01",
     '--balance: key "edge01"'),
    ("layers-balance-too-many", "fig2", {},
     "layers {d}/model.onnx --balance " + ",".join(f"edge01_cpu{k}" for k in range(9)),
     "--balance: 9 keys for 5 layers"),
    ("layers-balance-twice", "fig2", {}, "layers {d}/model.onnx --balance a_gpu,a_gpu",
     '--balance: key "a_gpu" is given 2 times'),
    # -- profile --------------------------------------------------------------------------------
    ("profile-threads-negative", "fig2", {}, PROFILE + " --threads -1", "--threads"),
    ("profile-threads-bomb", "fig2", {}, PROFILE + " --threads 99999999999999999999",
     "--threads 99999999999999999999"),
    ("profile-runs-zero", "fig2", {}, PROFILE + " --runs 0", "--runs 0"),
    ("profile-platform-not-utf8", "fig2", {"platform.txt": b"\xff"}, PROFILE,
     "platform.txt: not UTF-8 text"),
    ("profile-output-parent-file", "fig2", {"afile": "x"},
     PROFILE.replace("{d}/profile.out.json", "{d}/afile/p.json"), "afile/p.json: cannot write"),
    ("profile-inventory-not-toml", "fig2", {"inventory.toml": "hosts = [\n"},
     PROFILE + " -i {d}/inventory.toml", "inventory.toml: not valid TOML"),
    # -- dse ------------------------------------------------------------------------------------
    ("dse-profile-not-utf8", "fig2", {"profile.json": b"{\xff}"}, DSE,
     "profile.json: not UTF-8 text"),
    ("dse-profile-nested", "fig2", {"profile.json": nested(100_000)}, DSE,
     "profile.json: nested too deeply"),
    ("dse-profile-list", "fig2", {"profile.json": "[1]"}, DSE, "profile.json: not a profile"),
    ("dse-profile-missing-layers", "fig2",
     {"profile.json": profile_edit(set_path("layers", DELETE))}, DSE,
     "profile.json: not a profile"),
    ("dse-profile-negative-ms", "fig2",
     {"profile.json": profile_edit(set_path("layers.0.cpu_ms.1", -3.0))}, DSE,
     'profile.json: layer "MaxPool1": cpu_ms'),
    ("dse-profile-nan-ms", "fig2",
     {"profile.json": profile_edit(set_path("layers.0.cpu_ms.1", float("nan")))}, DSE,
     'profile.json: layer "MaxPool1": cpu_ms'),
    ("dse-profile-zero-bandwidth", "fig2",
     {"profile.json": profile_edit(set_path("links.shm.bandwidth", 0))}, DSE,
     'profile.json: link "shm": bandwidth'),
    ("dse-profile-threads-zero", "fig2",
     {"profile.json": profile_edit(set_path("threads", [0, 2]))}, DSE,
     "profile.json: threads"),
    ("dse-platform-bandwidth-zero", "fig2",
     {"profile.json": profile_json,
      "platform.txt": PLATFORM.replace("slots=0-5,", "slots=0-5, bandwidth=0mbit,", 1)}, DSE,
     "bandwidth=0mbit: must be more than 0"),
    ("dse-pop", "fig2", {"profile.json": profile_json}, DSE + " --pop 2",
     "--pop 2: needs at least 4"),
    ("dse-pop-huge", "fig2", {"profile.json": profile_json}, DSE + " --pop 99999999999",
     "--pop 99999999999: at most 100000"),
    ("dse-gens-huge", "fig2", {"profile.json": profile_json}, DSE + " --gens 99999999999",
     "--gens 99999999999: at most 1000000"),
    ("dse-profile-huge-number", "fig2", {"profile.json": '{"version": 1, "threads": [' +
                                         "2" * 5000 + "]}"}, DSE,
     "profile.json: holds a number too long to read"),
    ("dse-segments", "fig2", {"profile.json": profile_json}, DSE + " --segments 0",
     "--segments 0: needs at least 1"),
    ("dse-profile-unknown-host", "fig2", {"profile.json": profile_json},
     DSE + " --profile edge99={d}/profile.json", 'profile for host "edge99": no such host'),
    ("dse-output-is-file", "fig2", {"profile.json": profile_json, "front": "x"}, DSE,
     "front' is a file"),
    ("dse-output-user-file", "fig2", {"profile.json": profile_json,
                                      "front": foreign_folder("front", ".autodice-output")},
     DSE, "front: holds files autodice did not write (keep.txt)"),
    # -- deploy's inventory ---------------------------------------------------------------------
    ("inventory-not-utf8", "split", {"inventory.toml": b"[hosts.edge01]\naddress = \"\xff\"\n"},
     DEPLOY, "inventory.toml: not UTF-8 text"),
    ("inventory-nested", "split", {"inventory.toml": nested(100_000, "toml")}, DEPLOY,
     "inventory.toml: nested too deeply"),
    ("inventory-not-toml", "split", {"inventory.toml": "[hosts.edge01\n"}, DEPLOY,
     "inventory.toml: not valid TOML"),
    ("inventory-missing-host", "split",
     {"inventory.toml": INVENTORY.replace("[hosts.edge04]", "[hosts.edge05]")}, DEPLOY,
     "host edge04 of the plan has no [hosts.edge04] entry"),
    ("inventory-relative-dir", "split",
     {"inventory.toml": INVENTORY.replace("/home/root/autodice", "autodice")}, DEPLOY,
     'remote_dir "autodice" must be an absolute path'),
    ("inventory-dotdot-dir", "split",
     {"inventory.toml": INVENTORY.replace("/home/root/autodice", "/home/../../etc")}, DEPLOY,
     'remote_dir "/home/../../etc" must be an absolute path'),
    ("inventory-root-dir", "split", {"inventory.toml": INVENTORY.replace("/home/root/autodice",
                                                                         "/home")}, DEPLOY,
     'remote_dir "/home" is too close to /'),
    ("inventory-port", "split", {"inventory.toml": INVENTORY.replace('user = "root"',
                                                                     "port = 70000")}, DEPLOY,
     "port 70000 must be a number from 1 to 65535"),
    ("inventory-address-injection", "split",
     {"inventory.toml": INVENTORY.replace('"10.77.0.11"', '"-oProxyCommand=sh"')}, DEPLOY,
     'address "-oProxyCommand=sh" is not a host name or IP address'),
    ("inventory-user-injection", "split",
     {"inventory.toml": INVENTORY.replace('"root"', '"root; rm -rf ~"')}, DEPLOY,
     'user "root; rm -rf ~" must be letters'),
    ("inventory-same-address", "split",
     {"inventory.toml": INVENTORY.replace('"10.77.0.14"', '"10.77.0.11"')}, DEPLOY,
     "host edge04 has the same address as edge01"),
    ("inventory-hosts-not-table", "split", {"inventory.toml": 'hosts = "edge01"\n'}, DEPLOY,
     "inventory.toml: [defaults] and [hosts.NAME] must be tables"),
    ("inventory-unknown-key", "split",
     {"inventory.toml": INVENTORY.replace('user = "root"', 'usr = "root"')}, DEPLOY,
     'unknown key "usr" (did you mean "user"?)'),
    ("inventory-identity-missing", "split",
     {"inventory.toml": INVENTORY.replace('user = "root"', 'identity = "nope_key"')}, DEPLOY,
     "nope_key does not exist"),
    ("inventory-missing", "split", {}, DEPLOY, "inventory.toml: cannot read"),
    ("inventory-huge-number", "split",
     {"inventory.toml": INVENTORY.replace('user = "root"', "port = " + "9" * 5000)}, DEPLOY,
     "inventory.toml: holds a number too long to read"),
    ("deploy-timeout", "split", {"inventory.toml": INVENTORY, "x.npy": npy((1, 4, 8, 8))},
     DEPLOY + " --run --input {d}/x.npy --timeout 0", "--timeout 0"),
    # -- cluster options (checked before anything is created) -----------------------------------
    ("cluster-cores-bomb", "fig2", {}, "cluster up --hosts edge01 --cores edge01=0-99999999999",
     "--cores edge01=0-99999999999: core 99999999999 is past 4095"),
    ("cluster-cores-no-eq", "fig2", {}, "cluster up --hosts edge01 --cores edge01",
     "--cores edge01: expected HOST=CPUS"),
    ("cluster-cores-unknown-host", "fig2", {}, "cluster up --hosts edge01 --cores edge09=0",
     '"edge09" is not one of --hosts'),
    ("cluster-hosts-bad", "fig2", {}, "cluster up --hosts edge_01", '"edge_01" is not a host name'),
    ("cluster-hosts-twice", "fig2", {}, "cluster up --hosts edge01,edge01",
     '"edge01" is given twice'),
    ("cluster-hosts-empty", "fig2", {}, "cluster up --hosts ,", "give at least one host name"),
    ("cluster-bandwidth", "fig2", {}, "cluster up --hosts edge01 --bandwidth fast",
     "--bandwidth fast"),
    ("cluster-bandwidth-zero", "fig2", {}, "cluster up --hosts edge01 --bandwidth 0mbit",
     "--bandwidth 0mbit: must be more than 0"),
    ("cluster-subnet", "fig2", {}, "cluster up --hosts edge01 --subnet 10.77.0.0/30",
     "--subnet 10.77.0.0/30: too small"),
    ("cluster-subnet-garbage", "fig2", {}, "cluster up --hosts edge01 --subnet ten",
     "--subnet ten"),
    # -- options in general ---------------------------------------------------------------------
    ("option-unknown", "fig2", {}, SPLIT + " --chek", "--chek"),
    ("option-missing", "fig2", {}, "split {d}/model.onnx -p {d}/platform.txt -o {d}/out",
     "--mapping"),
    ("verb-unknown", "fig2", {}, "splat {d}/model.onnx", "splat"),
]


@pytest.fixture(scope="module")
def split_of_fig2(tmp_path_factory) -> Path:
    """A split of Figure 2 (model, mapping, platform and out/), made once and copied per case."""
    d = tmp_path_factory.mktemp("fig2split")
    (d / "platform.txt").write_text(PLATFORM)
    (d / "mapping.json").write_text(MAPPING)
    onnx.save(figure2(), d / "model.onnx")
    split(d / "model.onnx", d / "mapping.json", d / "platform.txt", d / "out")
    return d


def snapshot(d: Path) -> dict[str, tuple]:
    """Every path under ``d`` with its kind, size and content digest (links: their target)."""
    import hashlib

    seen = {}
    for root, dirs, files in os.walk(d):
        for name in dirs + files:
            p = Path(root) / name
            rel = str(p.relative_to(d))
            if p.is_symlink():
                seen[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                seen[rel] = ("dir",)
            else:
                seen[rel] = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
    return seen


def write_files(d: Path, files: dict) -> None:
    for name, content in files.items():
        path = d / name
        if content is None:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        elif callable(content):
            result = content(d)
            if isinstance(result, str):  # a text maker: profile_json(d)
                path.write_text(result)
        elif isinstance(content, onnx.ModelProto):
            onnx.save(content, path)
        else:
            path.write_bytes(content if isinstance(content, bytes) else content.encode())


@pytest.fixture
def no_cluster_changes(monkeypatch):
    """``cluster up`` must refuse its options before it needs root or touches the network."""
    from autodice.deploy.emulated import cluster

    def refuse(*args, **kwargs):
        raise AssertionError("test: the options were accepted; nothing may be created here")

    monkeypatch.setattr(cluster, "require_root", refuse)
    monkeypatch.setattr(cluster, "load_state", refuse)


@pytest.mark.parametrize("base, files, command, expected", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_malformed_input_exits_2_naming_the_culprit(tmp_path, split_of_fig2, no_cluster_changes,
                                                     base, files, command, expected):
    d = tmp_path / "w"
    if base == "split":
        shutil.copytree(split_of_fig2, d, symlinks=True)
    else:
        d.mkdir()
        (d / "platform.txt").write_text(PLATFORM)
        (d / "mapping.json").write_text(MAPPING)
        onnx.save(figure2(), d / "model.onnx")
    write_files(d, files)
    before = snapshot(tmp_path)
    args = [a.format(d=d) for a in command.split()]
    result = CliRunner().invoke(main, args)
    out = result.output
    assert result.exit_code == 2, out
    assert "Traceback" not in out and not isinstance(result.exception, Exception), out
    assert out.startswith("error: "), out
    lines = out.strip().splitlines()
    assert all(line.startswith("error: ") for line in lines), out
    assert len(lines) <= 50, f"{len(lines)} lines"
    assert expected.format(d=d) in out, out
    assert snapshot(tmp_path) == before  # nothing written, nothing removed, no temporary


def test_the_table_has_a_hundred_cases():
    assert len(CASES) >= 100
    assert len({c[0] for c in CASES}) == len(CASES)


# --- what malformed-looking input must still do -------------------------------------------------


def test_slots_as_a_list_keep_their_commas(fig2):
    text = (fig2 / "platform.txt").read_text().replace("edge01, arm, slots=0-5",
                                                       "edge01, arm, slots=1,2,3, mem=8GB")
    (fig2 / "platform.txt").write_text(text)
    r = CliRunner().invoke(main, SPLIT.format(d=fig2).split())
    assert r.exit_code == 0, r.output
    assert "rank 0=edge01 slots=1,2,3" in (fig2 / "out" / "rankfile").read_text()


def test_external_data_inside_the_model_folder_is_read(fig2):
    """A weight file beside the model (the normal case) still works, and the split holds it."""
    data = numpy_helper.to_array(initializer(figure2(), "w_fc")).tobytes()
    (fig2 / "weights").mkdir()
    (fig2 / "weights" / "w.bin").write_bytes(b"\0" * 8 + data)
    onnx.save(external("weights/w.bin", offset="8", length=str(len(data))), fig2 / "model.onnx")
    r = CliRunner().invoke(main, [*SPLIT.format(d=fig2).split(), "--check"])
    assert r.exit_code == 0, r.output
    assert "max abs 0" in r.output


def test_output_on_another_filesystem(fig2):
    """copy_file_range cannot cross filesystems (EXDEV); the copy falls back to read and write."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(fig2).st_dev:
        pytest.skip("no second filesystem here")
    out = Path(shm / f"autodice-test-{os.getpid()}")
    try:
        r = CliRunner().invoke(main, [*SPLIT.format(d=fig2).split()[:-1], str(out), "--check"])
        assert r.exit_code == 0, r.output
        assert "max abs 0" in r.output
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_copy_falls_back_when_the_kernel_cannot_copy(fig2, monkeypatch):
    def exdev(*args):
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(os, "copy_file_range", exdev)
    r = CliRunner().invoke(main, [*SPLIT.format(d=fig2).split(), "--check"])
    assert r.exit_code == 0, r.output
    assert "max abs 0" in r.output


def test_a_full_disk_is_one_line_and_leaves_nothing(fig2, monkeypatch):
    from autodice.frontend import split as split_module

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(fig2 / "out"))

    monkeypatch.setattr(split_module, "write_tables", full)
    before = sorted(p.name for p in fig2.iterdir())
    r = CliRunner().invoke(main, SPLIT.format(d=fig2).split())
    assert r.exit_code == 2 and r.output.startswith("error: "), r.output
    assert "No space left on device" in r.output and len(r.output.splitlines()) == 1
    assert sorted(p.name for p in fig2.iterdir()) == before


def test_a_split_replaces_its_own_output_and_the_folders_later_verbs_wrote(fig2):
    """An earlier split, with what gen/build/run/dse/deploy write inside it (they claim their
    folders in the manifest), is replaced; the manifest lists what split wrote."""
    args = SPLIT.format(d=fig2).split()
    assert CliRunner().invoke(main, args).exit_code == 0
    from autodice.core.outdir import claim

    for folder in ("packages", "ncnn", "build", "results", "measure", "deploy"):
        claim(fig2 / "out", folder + "/")
        (fig2 / "out" / folder / "sub").mkdir(parents=True)
        (fig2 / "out" / folder / "sub" / "f").write_text("x")
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert not (fig2 / "out" / "packages").exists()
    manifest = (fig2 / "out" / ".autodice-output").read_text().splitlines()
    assert "plan.json" in manifest and "models/edge04_gpu.onnx" in manifest


def test_ten_thousand_bad_keys_are_a_short_report(fig2):
    (fig2 / "mapping.json").write_text(json.dumps({f"edge{k:05d}_gpu": ["Conv1"]
                                                   for k in range(10_000)}))
    r = CliRunner().invoke(main, SPLIT.format(d=fig2).split())
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 21, len(lines)
    assert lines[-1].endswith("and 9980 more keys whose host is not in "
                              f"{fig2 / 'platform.txt'}"), lines[-1]


def test_a_byte_order_mark_and_crlf_lines_are_fine(fig2):
    """Windows editors save specs with a BOM and CRLF line ends; neither is part of a name."""
    for name in ("platform.txt", "mapping.json"):
        text = (fig2 / name).read_text()
        (fig2 / name).write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
    r = CliRunner().invoke(main, SPLIT.format(d=fig2).split())
    assert r.exit_code == 0, r.output


def test_a_failed_gen_leaves_no_half_of_ncnn(split_of_fig2, tmp_path, monkeypatch):
    """gen converts aside and renames ncnn/ in only when every conversion checks out."""
    from autodice.backend import gen as gen_module
    from autodice.core.errors import AutodiceError

    def wrong(*args, **kwargs):
        raise AutodiceError('rank 0 (key "edge01_arm123"): ncnn computes "Buff4" off by 1')

    monkeypatch.setattr(gen_module, "verify_conversions", wrong)
    d = tmp_path / "w"
    shutil.copytree(split_of_fig2, d)
    before = snapshot(d)
    r = CliRunner().invoke(main, ["gen", str(d / "out")])
    assert r.exit_code == 2 and r.output.startswith("error: rank 0"), r.output
    assert snapshot(d) == before
