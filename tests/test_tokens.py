"""Transformer plumbing cut at a sub-model's edge, small enough for CI: the shapes at which
pnnx's idea of a batch axis, ncnn's four axes and pnnx's fused layers met a cut (LeViT, DeiT,
MobileViT, EdgeNeXt and Swin, found in ``make fidelity``). Each runs split -> gen -> build ->
run under mpirun, equal to onnxruntime."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from graphs import window_attention
from onnx import TensorProto, helper
from test_fidelity import random_mapping, run_distributed
from token_graphs import levit_tokens, normalized, patch_tokens, vit_residual

from autodice.backend.gen import gen
from autodice.core.errors import AutodiceError
from autodice.frontend.split import split


@pytest.mark.cpp
@pytest.mark.parametrize("mapping", [
    {"edge01_x860": ["embed", "tokens", "rows", "linear", "flat"], "edge01_x861": ["bn"],
     "edge01_x862": ["back", "proj"]},
    {"edge01_x860": ["embed", "tokens", "rows", "linear", "flat", "bn", "back", "proj"]}],
    ids=["bn alone", "whole"])
def test_a_batch_norm_over_flattened_tokens_runs_like_onnxruntime(tmp_path, mapping):
    """LeViT's BatchNorm reads 16 tokens x 12 channels: ncnn's BatchNorm would scale each token
    by another channel's statistics. Alone on a rank, and inside one."""
    onnx.save(levit_tokens(), tmp_path / "levit.onnx")
    x = np.random.default_rng(0).standard_normal((1, 8, 4, 4)).astype(np.float32)
    run_distributed(tmp_path / "levit.onnx", mapping, tmp_path, x)


@pytest.mark.cpp
def test_tokens_a_rank_only_adds_are_read_as_batched_tokens(tmp_path):
    """The residual's tokens reach the rank read by an Add alone, beside tokens a Linear reads:
    pnnx must see both with a batch, or ncnn adds a 16x8 to a 1x16x8 into 16x16x8 (DeiT-Tiny
    and EdgeNeXt cut at their residuals)."""
    onnx.save(vit_residual(), tmp_path / "vit.onnx")
    mapping = {"edge01_x860": ["embed", "tokens", "rows", "act"],
               "edge01_x861": ["mlp", "residual", "proj"]}
    x = np.random.default_rng(0).standard_normal((1, 8, 4, 4)).astype(np.float32)
    run_distributed(tmp_path / "vit.onnx", mapping, tmp_path, x)


# Window attention cut where the rewrites to at most four axes meet the wire: at the 6-D
# partition, at the 5-D heads before and after their split, at the masked 5-D scores.
WINDOW_MAPPINGS = {
    "cuts": {"edge01_x860": ["conv1", "nhwc", "partition", "heads", "q", "q5", "masked"],
             "edge01_x861": ["windows", "tokens", "qkv", "split", "k", "k5", "scores", "unwindow",
                             "image"],
             "edge01_x862": ["v", "attend", "probs", "mix", "gather_heads", "merge_heads",
                             "nchw", "conv2"]},
    "contiguous": 0,
    "interleaved": 1,
    "short runs": 2,
}


@pytest.mark.cpp
@pytest.mark.parametrize("how", list(WINDOW_MAPPINGS))
def test_window_attention_cut_at_its_5d_and_6d_tensors_runs_like_onnxruntime(tmp_path, how):
    """ncnn holds four axes: each rank's 5-D and 6-D plumbing is rewritten onto four or fewer,
    and a 6-D tensor crosses the wire in a 4-D form both sides agree on."""
    onnx.save(window_attention(), tmp_path / "window.onnx")
    mapping = WINDOW_MAPPINGS[how]
    if isinstance(mapping, int):
        mapping = random_mapping(tmp_path / "window.onnx", mapping, most=3)
    x = np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32)
    run_distributed(tmp_path / "window.onnx", mapping, tmp_path, x)
    for sub in (tmp_path / "out" / "models").glob("*.onnx"):
        model = onnx.shape_inference.infer_shapes(onnx.load(sub))
        high = [v.name for v in (*model.graph.value_info, *model.graph.input,
                                 *model.graph.output)
                if len(v.type.tensor_type.shape.dim) > 4]
        assert not high, f"{sub.name}: tensors of more than four axes: {high}"



@pytest.mark.cpp
def test_a_6d_tensor_read_by_an_op_without_a_rewrite_is_named(tmp_path):
    """A mean over a 6-D tensor has no rewrite onto four axes: gen says so, naming the op."""
    model = window_attention()
    g = model.graph
    g.node.append(helper.make_node("ReduceMean", ["part"], ["part_mean"], name="mean6d",
                                   axes=[2, 4], keepdims=1))
    g.output.append(helper.make_tensor_value_info("part_mean", TensorProto.FLOAT, None))
    onnx.save(model, tmp_path / "window.onnx")
    (tmp_path / "platform.txt").write_text("edge01, x86, slots=0-3\n")
    (tmp_path / "mapping.json").write_text(json.dumps({"edge01_x860": [
        n.name for n in g.node]}))
    split(tmp_path / "window.onnx", tmp_path / "mapping.json", tmp_path / "platform.txt",
          tmp_path / "out")
    with pytest.raises(AutodiceError, match=r"no rewrite onto four axes for ReduceMean "
                                            r'\(mean6d reads "part" \(1x2x4x2x4x4\)\)'):
        gen(tmp_path / "out")


# MobileViT's tokens cut between its attention blocks: rank 0 sends the 4x4x8 tokens and its
# attention's output, rank 1 sends what its attention adds to them, each read by attention on
# the other side, where pnnx makes the leading 4 ncnn's batch.
PATCH_CUTS = ("residual", "gather")


@pytest.mark.cpp
def test_tokens_whose_leading_axis_ncnn_batches_cross_a_cut(tmp_path):
    """Without a Reshape between the runtime's one Mat and pnnx's four at each edge, ncnn sends
    32 elements of 128 and a rank reading them computes on a quarter (MobileViT: "ncnn computes
    add_8 with 7680 elements, onnxruntime 30720")."""
    model = patch_tokens()
    onnx.save(model, tmp_path / "patches.onnx")
    names = [n.name for n in model.graph.node]
    cuts = [0, *(names.index(c) for c in PATCH_CUTS), len(names)]
    mapping = {f"edge01_x86{k}": names[lo:hi] for k, (lo, hi) in enumerate(zip(cuts, cuts[1:]))}
    x = np.random.default_rng(0).standard_normal((1, 8, 4, 4)).astype(np.float32)
    run_distributed(tmp_path / "patches.onnx", mapping, tmp_path, x)
    # Both ends of the first cut reshape: rank 0 from pnnx's batch of 4, rank 1 into it.
    params = [(tmp_path / "out" / "ncnn" / f"edge01_x86{k}.ncnn.param").read_text()
              for k in range(2)]
    assert "12=0 13=233" in params[0] and "12=233 13=0" in params[1]


@pytest.mark.cpp
@pytest.mark.parametrize("shape, axis", [([1, 4, 12, 16], -1), ([1, 4, 12, 16], 2),
                                         ([1, 12, 16], 1), ([1, 64], 1), ([1, 8, 6, 6], 1)])
def test_a_normalize_over_any_axis_converts_right(tmp_path, shape, axis):
    """pnnx fuses ``F.normalize`` into an ncnn Normalize over channels, whatever the axis, and
    is wrong even over the channels of 3-D tokens or a 2-D embedding (EdgeNeXt's attention: 2x
    its scale off). gen's check holds each conversion to onnxruntime."""
    onnx.save(normalized(shape, axis), tmp_path / "norm.onnx")
    (tmp_path / "platform.txt").write_text("edge01, x86, slots=0-3\n")
    (tmp_path / "mapping.json").write_text(json.dumps({"edge01_x860": [
        "scaled", "norm", "floor", "spread", "output"]}))
    split(tmp_path / "norm.onnx", tmp_path / "mapping.json", tmp_path / "platform.txt",
          tmp_path / "out")
    gen(tmp_path / "out")
    param = (tmp_path / "out" / "ncnn" / "edge01_x860.ncnn.param").read_text()
    # The one case pnnx converts right keeps its single layer.
    assert ("Normalize" in param) == (len(shape) == 4 and axis == 1)
