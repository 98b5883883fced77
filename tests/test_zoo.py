"""Real CNNs from the ONNX model zoo, full size with seeded weights, split several ways."""

import json
import random

import numpy as np
import onnx
import pytest

from autodice.core.model import load_model
from autodice.frontend.check import check
from autodice.frontend.split import split
from autodice.frontend.suggest import balanced_mapping

PLATFORM = """\
edge01, arm, slots=0-5, gpu=NVIDIAVolta (CUDA)
edge02, arm, slots=0-5, gpu=NVIDIAVolta (CUDA)
edge04, x86, slots=0-11, gpu=AMDRX6800 (VULKAN)
"""
KEYS = ["edge01_arm0", "edge01_arm12345", "edge02_gpu", "edge04_cpu0-11", "edge01_gpu"]


def interleaved(graph, keys, blocks):
    """Layers in ``blocks`` runs dealt round-robin to ``keys``: non-contiguous, ping-pong."""
    layers = [graph.names[i] for i in range(len(graph.nodes)) if i not in graph.followers]
    size = -(-len(layers) // blocks)
    mapping = {k: [] for k in keys}
    for b in range(blocks):
        mapping[keys[b % len(keys)]] += layers[b * size:(b + 1) * size]
    return mapping


def scattered(graph, keys, seed):
    """Every layer on a random key."""
    rng = random.Random(seed)
    mapping = {k: [] for k in keys}
    for i in range(len(graph.nodes)):
        if i not in graph.followers:
            mapping[rng.choice(keys)].append(graph.names[i])
    return mapping


CASES = [
    ("vgg19", "balanced3", lambda g: balanced_mapping(g, KEYS[:3])),
    ("vgg19", "interleaved", lambda g: interleaved(g, KEYS[:2], 6)),
    ("densenet121", "balanced5", lambda g: balanced_mapping(g, KEYS)),
    ("densenet121", "interleaved", lambda g: interleaved(g, KEYS[:3], 9)),
    ("resnet50", "balanced2", lambda g: balanced_mapping(g, KEYS[:2])),
    ("resnet50", "interleaved", lambda g: interleaved(g, KEYS[:3], 12)),
    ("resnet101", "balanced3", lambda g: balanced_mapping(g, KEYS[:3])),
    ("squeezenet", "balanced4", lambda g: balanced_mapping(g, KEYS[:4])),
    ("squeezenet", "scattered", lambda g: scattered(g, KEYS[:3], 1)),
    ("inception_v1", "balanced3", lambda g: balanced_mapping(g, KEYS[:3])),
    ("inception_v1", "scattered", lambda g: scattered(g, KEYS[:2], 2)),
]


@pytest.mark.parametrize("name, how, make", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_zoo_split_matches_onnxruntime(tmp_path, zoo_model, name, how, make):
    path = zoo_model(name)
    graph = load_model(path)
    (tmp_path / "mapping.json").write_text(json.dumps(make(graph)))
    (tmp_path / "platform.txt").write_text(PLATFORM)
    plan = split(path, tmp_path / "mapping.json", tmp_path / "platform.txt", tmp_path / "out")
    assert sum(len(r.layers) for r in plan.ranks) == len(graph.nodes) - len(graph.followers)
    params = sum(r.memory.params for r in plan.ranks)
    assert params >= sum(t.nbytes for t in graph.tensors.values() if t.nbytes > 4096)
    for r in plan.ranks:
        onnx.checker.check_model(str(tmp_path / "out" / r.submodel))
    for diff in check(tmp_path / "out"):
        assert diff.rel <= 1e-4, diff


def test_resnet101_is_resnet50_with_res4_grown_to_23_blocks(zoo_model):
    """The wheel ships no ResNet-101; the zoo grows ResNet-50's res4 stage (He et al. 2016)."""
    model = onnx.load(str(zoo_model("resnet101")))
    onnx.checker.check_model(model)
    ops = [n.op_type for n in model.graph.node]
    # 100 convolutions in blocks, conv1 and 3 shortcuts
    assert ops.count("Conv") == 104 and ops.count("Sum") == 33
    weights = {i.name for i in model.graph.initializer}
    assert {f"gpu_0/res4_{k}_branch2b_w_0" for k in range(23)} <= weights
    assert "gpu_0/res4_23_branch2b_w_0" not in weights
    params = sum(int(np.prod(i.dims)) for i in model.graph.initializer)
    assert 44.5e6 < params < 44.8e6  # ResNet-101's 44.5 M, with the zoo's separate BatchNorms
