"""The verbs as a user types them (click's CliRunner), on the Figure 2 example and ResNet-50."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import numpy_helper

from autodice.cli import main


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def split_fig2(fig2):
    return invoke("split", fig2 / "model.onnx", "-m", fig2 / "mapping.json", "-p",
                  fig2 / "platform.txt", "-o", fig2 / "out")


def test_split_prints_the_memory_table_and_checks(fig2):
    r = invoke("split", fig2 / "model.onnx", "-m", fig2 / "mapping.json", "-p",
               fig2 / "platform.txt", "-o", fig2 / "out", "--check", "--samples", "2")
    assert r.exit_code == 0, r.output
    assert "3 ranks, 4 cut tensors" in r.output and "edge01_arm123" in r.output
    assert "check output: max abs 0" in r.output


def test_split_reads_the_mapping_from_a_pipe_once(fig2):
    """`-m <(make-mapping)`: a pipe reads once, and the output keeps what was read."""
    text = (fig2 / "mapping.json").read_text()
    r, w = os.pipe()
    os.write(w, text.encode())
    os.close(w)
    try:
        res = invoke("split", fig2 / "model.onnx", "-m", f"/dev/fd/{r}", "-p",
                     fig2 / "platform.txt", "-o", fig2 / "out")
    finally:
        os.close(r)
    assert res.exit_code == 0, res.output
    assert (fig2 / "out" / "mapping.json").read_text() == text


def test_check_fails_when_a_submodel_is_wrong(fig2):
    assert split_fig2(fig2).exit_code == 0
    path = fig2 / "out" / "models" / "edge04_gpu.onnx"
    sub = onnx.load(path)
    w = sub.graph.initializer[0]
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * 1.01, w.name))
    onnx.save(sub, path)
    r = invoke("check", fig2 / "out")
    assert r.exit_code == 1 and "FAIL" in r.output


def test_check_without_a_plan(tmp_path):
    r = invoke("check", tmp_path)
    assert r.exit_code == 2 and "no plan here" in r.output


def test_layers_lists_names_and_suggests_a_mapping(fig2, zoo_model):
    r = invoke("layers", fig2 / "model.onnx")
    assert r.exit_code == 0
    for name in ("MaxPool1", "Conv1", "FC1", "Add1", "Relu1"):
        assert name in r.output
    rows = json.loads(invoke("layers", zoo_model("resnet50"), "--json").output)
    conv = rows[0]
    assert (conv["op"], conv["shape"], conv["param_bytes"]) == ("Conv", "1x64x112x112",
                                                                 64 * 3 * 7 * 7 * 4)
    assert conv["flops"] == 2 * 64 * 112 * 112 * 3 * 7 * 7
    mapping = json.loads(invoke("layers", zoo_model("resnet50"), "--balance",
                                "a_arm0,b_arm1", "--by", "flops").output)
    assert list(mapping) == ["a_arm0", "b_arm1"]
    assert len(mapping["a_arm0"]) + len(mapping["b_arm1"]) == len(rows)


def test_view_draws_png_and_svg(fig2):
    assert split_fig2(fig2).exit_code == 0
    for suffix in ("png", "svg"):
        r = invoke("view", fig2 / "out", "-o", fig2 / f"partition.{suffix}")
        assert r.exit_code == 0, r.output
    assert (fig2 / "partition.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = (fig2 / "partition.svg").read_text()
    assert "rank 0: edge01_arm123" in svg and "256 B" in svg  # legend and a cut label


def test_view_rejects_unknown_format(fig2):
    assert split_fig2(fig2).exit_code == 0
    r = invoke("view", fig2 / "out", "-o", fig2 / "p.bmp")
    assert r.exit_code == 2 and "p.bmp" in r.output


def test_zoo_writes_a_loadable_model(tmp_path):
    r = invoke("zoo", "squeezenet", "-o", tmp_path / "s.onnx")
    assert r.exit_code == 0
    m = onnx.load(tmp_path / "s.onnx")
    onnx.checker.check_model(m)
    params = sum(np.prod(i.dims) for i in m.graph.initializer)
    assert 1.2e6 < params < 1.3e6  # SqueezeNet 1.0 has 1.25 M parameters
    assert invoke("zoo", "lenet", "-o", tmp_path / "x.onnx").exit_code == 2


def test_input_names_and_paths_may_hold_an_equals_sign(tmp_path):
    from types import SimpleNamespace

    from autodice.cli.app import model_inputs
    from autodice.core.errors import AutodiceError

    def plan(*names):
        return SimpleNamespace(model_inputs=[SimpleNamespace(name=n) for n in names])

    odd = tmp_path / "a=b.npy"
    odd.touch()
    assert model_inputs(plan("data"), [f"data={odd}"]) == {"data": odd}
    assert model_inputs(plan("data"), [str(odd)]) == {"data": odd}
    assert model_inputs(plan("a", "a=b"), ["a=b=f.npy", "a=g.npy"]) == \
        {"a=b": Path("f.npy"), "a": Path("g.npy")}
    for p, spec in ((plan("a", "b"), "c=f.npy"), (plan("data"), "dta=f.npy")):
        with pytest.raises(AutodiceError, match="name one of the model inputs"):
            model_inputs(p, [spec])
    with pytest.raises(AutodiceError, match='--input data=g.npy: input "data" is given twice'):
        model_inputs(plan("data"), ["data=f.npy", "data=g.npy"])  # (the last one won)


@pytest.mark.cpp
def test_gen_precision_flags(fig2):
    """--fp16 is --precision fp16, and plain gen is auto (click 8.1 let an unused --fp16 that
    shared --precision's destination clear it: every gen failed there)."""
    assert split_fig2(fig2).exit_code == 0
    for args, want in (([], "auto"), (["--fp16"], "fp16")):
        r = invoke("gen", fig2 / "out", *args)
        assert r.exit_code == 0, r.output
        assert (fig2 / "out" / "packages" / ".precision").read_text().strip() == want
    r = invoke("gen", fig2 / "out", "--fp16", "--precision", "fp32")
    assert r.exit_code == 2 and r.output == "error: --fp16 and --precision fp32: one or the other\n"


@pytest.mark.parametrize("args, said", [
    (["zoo", "squeezenet", "-o", "z.onnx", "--seed", "-1"], "'--seed': -1 is not in the range"),
    (["check", "out", "--rtol", "nan"], "'--rtol': nan is not a finite number above 0"),
    (["run", "out", "--input", "x.npy", "--rtol", "0"], "'--rtol': 0 is not a finite number"),
    (["run", "out", "--input", "x.npy", "--top-k", "0"], "'--top-k': 0 is not in the range"),
])
def test_numbers_out_of_range_are_one_line(tmp_path, args, said):
    """Before: a traceback (--seed -1), or a whole run ending with every output "FAIL" (an
    --rtol of NaN or 0), or every class but one printed (--top-k -1)."""
    r = invoke(*args)
    assert r.exit_code == 2 and r.output.startswith("error: Invalid value for ") \
        and said in r.output and len(r.output.splitlines()) == 1, r.output


@pytest.mark.parametrize("args, said", [
    (["layers", "m.onnx", "--profile", "p.json"], "--profile: only with --balance"),
    (["layers", "m.onnx", "--balance", "a_x860,b_x860", "--by", "flops", "--profile", "p.json"],
     "--profile: only with --by time"),
    (["split", "m.onnx", "-m", "m.json", "-p", "p.txt", "-o", "out", "--samples", "3"],
     "--samples: only with --check"),
    (["dse", "m.onnx", "-p", "p.txt", "-o", "out", "--pace"], "--pace: only with --measure"),
    (["dse", "m.onnx", "-p", "p.txt", "-o", "out", "--rounds", "3"],
     "--rounds: only with --measure"),
    (["deploy", "out", "-i", "inv.toml", "--input", "x.npy"], "--input: only with --run"),
    (["deploy", "out", "-i", "inv.toml", "--run", "--front", "."], "--front: only with --recover"),
])
def test_an_option_that_needs_another_is_refused_without_it(args, said):
    """Before, it was ignored (a profile that did not exist, frames never sent) or, --front,
    turned recovery on by itself."""
    r = invoke(*args)
    assert r.exit_code == 2 and r.output == f"error: {said}\n", r.output


def test_errors_go_to_stderr_and_stdout_stays_clean(fig2):
    """A real process, as a shell sees it: `layers --balance > mapping.json` must not write an
    error into the mapping. Exit 2, nothing on stdout, one `error:` line on stderr."""
    (fig2 / "mapping.json").write_text('{"edge01_arm123": ["Conv1"], "bogus": ["FC1"]}')
    for named, argv in (
            ("missing.onnx", ["layers", fig2 / "missing.onnx", "--balance",
                              "edge01_x860,edge01_x861"]),
            ('mapping.json: key "bogus"', ["split", fig2 / "model.onnx", "-m",
                                           fig2 / "mapping.json", "-p", fig2 / "platform.txt",
                                           "-o", fig2 / "out"])):
        p = subprocess.run([sys.executable, "-m", "autodice", *map(str, argv)],
                           capture_output=True, text=True)
        assert p.returncode == 2 and p.stdout == "", (argv, p.stdout, p.stderr)
        assert p.stderr.startswith("error: ") and named in p.stderr, p.stderr
    assert not (fig2 / "out").exists()
