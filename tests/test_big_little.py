"""Boards with big and little cores (an RK3588's 4 Cortex-A76 + 4 Cortex-A55): the profile
times each kind pinned to its cores, the cost model runs a key on any little core at the little
cores' pace (OpenMP waits on its slowest thread), and the search never mixes the two in a key.

Profiles here are FIXTURES written by hand: they pin down what the model computes from a
profile. The ``cpp`` test measures for real, pinned to this machine's cores.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from test_cost import CHAIN_PROFILE, chain_model, plan_of

from autodice.cli import main
from autodice.core.errors import AutodiceError
from autodice.core.mapping import parse_keys
from autodice.core.model import load_model
from autodice.core.spec import format_cores, parse_platform_text
from autodice.dse.balance import measured_cost
from autodice.dse.cost import plan_cost
from autodice.dse.cost_model import CostModel
from autodice.dse.genes import Genes
from autodice.dse.profile import (
    LittleCores,
    load_profile,
    profile_from_json,
    profile_to_json,
    save_profile,
)
from autodice.dse.slots import candidate_slots
from autodice.dse.timing import Timing

# d1: cores 0-1 big, 2-3 little (twice as slow, and on 2 threads as the big ones scale).
PLATFORM = "d1, arm, slots=0-3, little=2-3\n"
LITTLE = replace(
    CHAIN_PROFILE,
    layers=tuple(replace(lc, little_ms={t: 2 * ms for t, ms in lc.cpu_ms.items()})
                 for lc in CHAIN_PROFILE.layers),
    little=LittleCores((2, 3), (0, 1), (1, 2)))


@pytest.fixture
def chain(tmp_path):
    onnx.save(chain_model(), tmp_path / "chain.onnx")
    return load_model(tmp_path / "chain.onnx")


def test_a_profile_with_little_cores_round_trips_and_is_checked(tmp_path):
    save_profile(LITTLE, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == LITTLE
    doc = profile_to_json(LITTLE)
    assert doc["little"] == {"cores": [2, 3], "big_cores": [0, 1], "threads": [1, 2]}
    assert doc["layers"][1]["little_ms"] == {"1": 20.0, "2": 12.0}
    assert "little" not in profile_to_json(CHAIN_PROFILE)  # one kind of core: as before
    del doc["layers"][1]["little_ms"]
    doc["layers"][2]["little_ms"]["4"] = 1.0
    with pytest.raises(AutodiceError) as e:
        profile_from_json(json.loads(json.dumps(doc)), "p.json")
    assert [line.split(": little_ms")[0] for line in e.value.problems] == [
        'p.json: layer "B"', 'p.json: layer "C"']


def test_a_key_on_any_little_core_is_timed_at_the_little_cores_pace(chain):
    platform = parse_platform_text(PLATFORM)
    timing = Timing(platform, LITTLE)
    big = timing.seconds("d1", ["A", "B", "C"], 2)
    assert timing.seconds("d1", ["A", "B", "C"], 2, little=True) == pytest.approx(2 * big)
    assert timing.on_little("d1", (1, 2)) and not timing.on_little("d1", (0, 1))
    # The plan's cost: the same layers on the big pair, the little pair, and one of each.
    costs = {key: plan_cost(plan_of(chain, platform, {key: ["A", "B", "C"]}), timing, chain)
             for key in ("d1_arm01", "d1_arm23", "d1_arm12")}
    compute = {k: c.ranks[0].compute_s for k, c in costs.items()}
    assert compute["d1_arm01"] == pytest.approx(sum(big))
    assert compute["d1_arm23"] == pytest.approx(2 * sum(big))
    assert compute["d1_arm12"] == compute["d1_arm23"]  # OpenMP waits on the little core
    # A profile without little times: the little cores count as big ones, and a note says so.
    plain = Timing(platform, CHAIN_PROFILE)
    assert plain.seconds("d1", ["B"], 2, little=True) == plain.seconds("d1", ["B"], 2)
    assert any("d1 name little= cores, and their profile has no times on them" in n
               for n in plain.notes)


def test_the_search_never_puts_big_and_little_cores_in_one_key(chain):
    timing = Timing(parse_platform_text(PLATFORM), LITTLE)
    slots = candidate_slots(timing, ["A", "B", "C"])
    assert [(s.key, s.kind, s.little) for s in slots] == [
        ("d1_arm0", "one", False), ("d1_arm01", "all", False), ("d1_arm1", "rest", False),
        ("d1_arm2", "one", True), ("d1_arm23", "all", True), ("d1_arm3", "rest", True)]
    cm = CostModel(chain, timing)
    genes = Genes(cm)
    rows = genes.decode(np.random.default_rng(0).integers(0, genes.n_alpha, (500, 3)))
    little = {k for k, s in enumerate(slots) if s.little}
    for row in rows:  # every decoded mapping: its keys' cores are disjoint and of one kind
        used = [slots[k] for k in set(row.tolist())]
        cores = [c for s in used for c in s.cores]
        assert len(cores) == len(set(cores))
        assert all(set(s.cores) <= {2, 3} if s.little else set(s.cores) <= {0, 1}
                   for s in used)
    # The little pair is predicted half as fast as the big pair, by the fast path too.
    one = {s.key: cm.cost(np.full(3, k)).throughput for k, s in enumerate(slots)}
    assert one["d1_arm23"] == pytest.approx(one["d1_arm01"] / 2, rel=0.01)
    assert little == {3, 4, 5}


def test_balance_times_each_key_on_its_kind_of_core(chain):
    names = ["A", "B", "C"]
    keys = parse_keys(["d1_arm01", "d1_arm23"], "--balance")
    cost = measured_cost(chain, keys, LITTLE, frozenset(),
                         platform=parse_platform_text(PLATFORM))
    assert [cost("d1_arm23", n) for n in names] == pytest.approx(
        [2 * cost("d1_arm01", n) for n in names])
    # Without a platform the profile's own little cores say which are which: B, 2 threads.
    alone = measured_cost(chain, keys, LITTLE, frozenset())
    assert (alone("d1_arm01", "B"), alone("d1_arm23", "B")) == pytest.approx((0.006, 0.012))


def test_little_cores_get_int8_twins_at_their_own_int8_times(chain, tmp_path):
    """int8 at 60 % of the time on the big cores, 40 % on the little ones (where int8 pays most:
    in-order cores): both kinds of core offer int8 keys, each at its own int8 times."""
    quantized = replace(LITTLE, layers=tuple(
        replace(lc, int8_ms={t: 0.6 * ms for t, ms in lc.cpu_ms.items()},
                int8_resident_bytes=lc.resident_bytes,
                little_int8_ms={t: 0.4 * ms for t, ms in lc.little_ms.items()})
        for lc in LITTLE.layers))
    save_profile(quantized, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == quantized
    timing = Timing(parse_platform_text(PLATFORM), quantized)
    twins = [s for s in candidate_slots(timing, ["A", "B", "C"]) if s.int8]
    assert {s.little for s in twins} == {False, True}
    little = timing.seconds("d1", ["B"], 2, little=True, int8=True)
    assert little == pytest.approx(timing.seconds("d1", ["B"], 2, little=True) * 0.4)
    assert timing.seconds("d1", ["B"], 2, int8=True) == pytest.approx(
        timing.seconds("d1", ["B"], 2) * 0.6)
    doc = profile_to_json(quantized)
    doc["layers"][0]["little_int8_ms"] = {"3": 1.0}
    with pytest.raises(AutodiceError, match='layer "A": little_int8_ms'):
        profile_from_json(doc, "p.json")


@pytest.mark.cpp
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to call one little")
def test_profile_times_every_layer_pinned_to_each_kind_of_core(fig2, tmp_path):
    """On this machine, its last core called little: every layer is timed twice, pinned, and
    the profiler checks it ran on exactly the cores it was pinned to."""
    cores = tuple(sorted(os.sched_getaffinity(0)))
    out = tmp_path / "p.json"
    r = CliRunner().invoke(main, ["profile", str(fig2 / "model.onnx"), "-p",
                                  str(fig2 / "platform.txt"), "-o", str(out), "--little",
                                  str(cores[-1]), "--threads", "1", "--warmup", "1", "--runs",
                                  "3", "--no-cache", "--int8"])
    assert r.exit_code == 0, r.output
    p = load_profile(out)
    assert p.little == LittleCores(cores[-1:], cores[:-1], (1,)) and p.threads == (1,)
    assert all(lc.little_ms[1] > 0 and lc.cpu_ms[1] > 0 for lc in p.layers)
    assert all(lc.little_int8_ms[1] > 0 and lc.int8_ms[1] > 0 for lc in p.layers)  # both kinds
    assert f"little cores {cores[-1]}: the whole model" in r.output
    assert "int8 on the little cores: the whole model" in r.output
    assert "a big core's time" in r.output
    every = format_cores(cores)
    r = CliRunner().invoke(main, ["profile", str(fig2 / "model.onnx"), "-p",
                                  str(fig2 / "platform.txt"), "--little", every, "-o",
                                  str(tmp_path / "q.json")])
    assert r.exit_code == 2, r.output
    assert f"--little {every}: the little cores must be some, not all" in r.output
    assert not (tmp_path / "q.json").exists()
