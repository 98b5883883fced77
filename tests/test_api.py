"""The Python API a DSE script uses: plan, split, check, gen, build, run, predict, search, with
the objectives and constraints a user picks."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from test_cost import fixture_profile

import autodice
from autodice.core.model import load_model

CPU_MAPPING = {"edge01_arm1": ["MaxPool1", "FC1"], "edge04_x861": ["Conv1", "Add1", "Relu1"]}


def test_import_is_cheap_and_lists_the_api():
    """`import autodice` loads nothing but itself (onnx, numpy and the rest load when a call
    needs them); asserted by the modules loaded, not by a clock on a noisy machine."""
    code = ("import sys; before = set(sys.modules); import autodice; "
            "print(sorted({m.split('.')[0] for m in set(sys.modules) - before}))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert loaded == "['autodice']", loaded
    assert {"plan", "split", "gen", "build", "run", "profile", "predict", "search"} <= set(
        dir(autodice))


def test_plan_and_predict_a_mapping_without_writing(fig2, tmp_path):
    profile = fixture_profile(load_model(fig2 / "model.onnx"))
    plan = autodice.plan(fig2 / "model.onnx", CPU_MAPPING, fig2 / "platform.txt")
    assert [r.key for r in plan.ranks] == list(CPU_MAPPING)
    cost = autodice.predict(fig2 / "model.onnx", profile, CPU_MAPPING, fig2 / "platform.txt")
    assert cost.throughput > 0 and len(cost.ranks) == 2
    assert sorted(p.name for p in fig2.iterdir()) == ["mapping.json", "model.onnx",
                                                      "platform.txt"]
    with pytest.raises(autodice.AutodiceError, match="needs its platform"):
        autodice.predict(fig2 / "model.onnx", profile, CPU_MAPPING)


def test_search_with_chosen_objectives_a_memory_cap_and_some_hosts(fig2):
    profile = fixture_profile(load_model(fig2 / "model.onnx"))
    front = autodice.search(fig2 / "model.onnx", fig2 / "platform.txt", profile,
                            objectives=("throughput", "memory"), max_memory="40MB",
                            hosts=["edge01", "edge02"], pop=16, gens=8)
    assert front.points and front.settings.objectives == ("throughput", "memory")
    for p in front.points:
        assert p.cost.max_memory <= 40e6
        assert {k.rpartition("_")[0] for k in p.mapping} <= {"edge01", "edge02"}
    with pytest.raises(autodice.AutodiceError, match="no mapping found that meets max memory"):
        autodice.search(fig2 / "model.onnx", fig2 / "platform.txt", profile, max_memory="1KB",
                        pop=8, gens=2)
    with pytest.raises(autodice.AutodiceError, match="hosts edge09: choose among"):
        autodice.search(fig2 / "model.onnx", fig2 / "platform.txt", profile, hosts=["edge09"])


@pytest.mark.cpp
def test_the_pipeline_from_a_script(fig2):
    (fig2 / "cpu.json").write_text(json.dumps(CPU_MAPPING))
    plan = autodice.split(fig2 / "model.onnx", fig2 / "cpu.json", fig2 / "platform.txt",
                          fig2 / "out")
    assert all(d.rel < 1e-5 for d in autodice.check(fig2 / "out"))
    autodice.gen(fig2 / "out")
    assert autodice.build(fig2 / "out").exists()
    np.save(fig2 / "x.npy", np.ones((1, 4, 8, 8), np.float32))
    result = autodice.run(fig2 / "out", {"input": fig2 / "x.npy"}, frames=3)
    assert result.stats["frames"] == 3 and len(result.stats["ranks"]) == len(plan.ranks)
