"""``autodice dse``: NSGA-II over mappings, its front, its files, and re-running points for real.

Profiles are FIXTURES derived from FLOPs (``test_cost.fixture_profile``), not measurements.
"""

import json
import socket

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from graphs import figure2, symbolic_model
from test_cost import fixture_profile

from autodice.cli import main
from autodice.core.model import load_model
from autodice.core.plan import check_plan
from autodice.core.spec import parse_platform_text
from autodice.dse.cost_model import CostModel
from autodice.dse.genes import Genes
from autodice.dse.problem import objectives
from autodice.dse.profile import save_profile
from autodice.dse.search import Settings, explore
from autodice.dse.timing import Timing
from autodice.frontend.check import check
from autodice.frontend.split import split

PLATFORM = """\
edge01, arm, slots=0-3, mem=4GB, power_idle=2.7W, power_cpu=1.1W, bandwidth=1gbit, latency=0.2ms
edge02, arm, slots=0-3, gpu=NVIDIAVolta (CUDA), mem=8GB, power_idle=4.5W, power_cpu=1.0W, \
power_gpu=9W, bandwidth=1gbit, latency=0.2ms
edge03, x86, slots=0-1, mem=16GB, power_idle=10W, power_cpu=4W, bandwidth=100MB/s, latency=0.5ms
"""


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def squeeze(zoo_model, tmp_path_factory):
    """SqueezeNet (68 layers), the 3-device platform and a FIXTURE profile, as files."""
    d = tmp_path_factory.mktemp("dse")
    model = zoo_model("squeezenet")
    (d / "platform.txt").write_text(PLATFORM)
    save_profile(fixture_profile(load_model(model)), d / "profile.json")
    return model, d


@pytest.fixture(scope="module")
def squeeze_out(squeeze):
    model, d = squeeze
    r = invoke("dse", model, "-p", d / "platform.txt", "--profile", d / "profile.json", "-o",
               d / "out", "--pop", 24, "--gens", 25, "--seed", 7)
    assert r.exit_code == 0, r.output
    return r, d / "out"


def test_front_dominates_random_valid_mappings(squeeze):
    model, _ = squeeze
    graph = load_model(model)
    timing = Timing(parse_platform_text(PLATFORM), fixture_profile(graph))
    front = explore(graph, timing, Settings(pop=100, gens=150, seed=1))
    F = np.array([[-p.cost.throughput, p.cost.max_energy_j, p.cost.max_memory / 1e6]
                  for p in front.points])
    for a in F:  # the front is mutually non-dominated
        assert not (np.all(F <= a, axis=1) & np.any(F < a, axis=1)).any()
    cm = CostModel(graph, timing)
    genes = Genes(cm)
    rng = np.random.default_rng(0)
    N = cm.n_layers
    per_layer = rng.integers(0, genes.n_alpha, (500, N))  # the paper's encoding, uniform
    runs = np.empty((500, N), dtype=int)  # random pipelines: 1-8 runs, random resources
    for i in range(500):
        k = rng.integers(1, 9)
        starts = np.concatenate([[0], np.sort(rng.choice(np.arange(1, N), k - 1, replace=False))])
        runs[i] = rng.integers(0, genes.n_alpha, k)[np.searchsorted(starts, np.arange(N),
                                                                    "right") - 1]
    R, G = objectives(cm.evaluate(genes.decode(np.vstack([per_layer, runs]))))
    R = R[(G <= 0).all(axis=1)]
    assert len(R) == 1000  # all fit in memory: they are valid mappings
    # 100 x 150 is enough here for every seed tried (0-5); 40 x 60 missed corners by < 3 %.
    dominated = [(np.all(F <= r, axis=1)).any() for r in R]
    assert np.mean(dominated) == 1.0, f"{np.sum(~np.array(dominated))} random mappings undominated"


def test_the_paper_table_and_the_files(squeeze_out):
    r, out = squeeze_out
    for word in ("1-device CPU", "1-device GPU", "energy mJ/frame", "throughput frames/s",
                 "memory MB", "#devices", "#cores", "#GPUs", "Pareto points"):
        assert word in r.output
    rows = (out / "pareto.csv").read_text().splitlines()
    assert rows[0] == ("point,throughput_fps,energy_j,memory_bytes,devices,cores,gpus,ranks,"
                       "period_s,bottleneck,mapping")
    doc = json.loads((out / "pareto.json").read_text())
    assert len(doc["points"]) == len(rows) - 1 == len(list((out / "mappings").iterdir()))
    assert doc["settings"] == {"pop": 24, "gens": 25, "seed": 7, "crossover": 0.5,
                               "mutation": 0.1, "encoding": "layer", "segments": None}
    assert [p["name"] if "name" in p else p["point"] for p in doc["references"]] == [
        "1-device CPU", "1-device GPU"]
    fps = [p["throughput_fps"] for p in doc["points"]]
    assert fps == sorted(fps, reverse=True)
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_emitted_mapping_passes_split_and_check(squeeze, squeeze_out):
    model, d = squeeze
    _, out = squeeze_out
    for path in sorted((out / "mappings").iterdir()):
        plan = split(model, path, d / "platform.txt", d / "split" / path.stem)
        check_plan(plan)
        assert list(json.loads(path.read_text())) == [r.key for r in plan.ranks]
        for diff in check(d / "split" / path.stem, samples=1):
            assert diff.rel <= 1e-4, (path.name, diff)


def test_seed_reproduces_the_front(squeeze, squeeze_out, tmp_path):
    model, d = squeeze
    _, first = squeeze_out
    args = ["dse", model, "-p", d / "platform.txt", "--profile", d / "profile.json", "--pop", 24,
            "--gens", 25]
    assert invoke(*args, "-o", tmp_path / "again", "--seed", 7).exit_code == 0
    for name in ("pareto.csv", "pareto.json", "pareto.png"):
        assert (tmp_path / "again" / name).read_bytes() == (first / name).read_bytes(), name
    assert invoke(*args, "-o", tmp_path / "other", "--seed", 8).exit_code == 0
    assert (tmp_path / "other" / "pareto.csv").read_text() != (first / "pareto.csv").read_text()


def test_overlapping_cores_are_repaired(squeeze):
    model, _ = squeeze
    graph = load_model(model)
    cm = CostModel(graph, Timing(parse_platform_text(PLATFORM), fixture_profile(graph)))
    genes = Genes(cm)
    alpha = {cm.slots[a].key: k for k, a in enumerate(genes.alpha)}
    assert "edge01_arm123" not in alpha  # "the other cores" is a repair, not a gene
    X = np.full(cm.n_layers, alpha["edge01_arm0123"])
    X[:5] = alpha["edge01_arm0"]
    keys = list(cm.mapping(genes.decode(X)[0]))
    assert keys == ["edge01_arm0", "edge01_arm123"]
    assert list(cm.mapping(genes.decode(np.full(cm.n_layers, alpha["edge01_arm0123"]))[0])) == [
        "edge01_arm0123"]


def test_segment_encoding(squeeze, tmp_path):
    model, d = squeeze
    r = invoke("dse", model, "-p", d / "platform.txt", "--profile", d / "profile.json", "-o",
               tmp_path / "out", "--pop", 16, "--gens", 10, "--encoding", "segment",
               "--segments", 3)
    assert r.exit_code == 0, r.output
    for path in (tmp_path / "out" / "mappings").iterdir():
        mapping = json.loads(path.read_text())
        assert len(mapping) <= 3  # at most 3 runs, so at most 3 ranks
        split(model, path, d / "platform.txt", tmp_path / "split")


def test_a_search_priced_with_fp16_cut_tensors(squeeze, squeeze_out, tmp_path):
    # Every point's fast-path cost was held to its plan's, both with the wire's bytes (dse
    # stops on an internal error otherwise); in fp32 the same mappings are no faster.
    import autodice

    model, d = squeeze
    r = invoke("dse", model, "-p", d / "platform.txt", "--profile", d / "profile.json", "-o",
               tmp_path / "out", "--pop", 24, "--gens", 25, "--seed", 7, "--wire", "fp16")
    assert r.exit_code == 0, r.output
    assert "note: priced with tensors that cross hosts in fp16" in r.output
    doc = json.loads((tmp_path / "out" / "pareto.json").read_text())
    fp32 = json.loads((squeeze_out[1] / "pareto.json").read_text())
    assert doc["settings"]["wire"] == "fp16" and "wire" not in fp32["settings"]
    crossing = 0
    for point in doc["points"]:
        mapping = tmp_path / "out" / point["mapping"]
        priced = {w: autodice.predict(model, d / "profile.json", mapping=mapping,
                                      platform=d / "platform.txt", wire=w).throughput
                  for w in ("fp16", "fp32")}
        assert priced["fp16"] == pytest.approx(point["throughput_fps"], rel=1e-5)
        assert priced["fp32"] <= priced["fp16"] * (1 + 1e-9)
        crossing += priced["fp32"] < priced["fp16"] * 0.999
    assert crossing  # some points cut between hosts, where fp16 is faster


def test_profile_per_host(squeeze, tmp_path):
    model, d = squeeze
    r = invoke("dse", model, "-p", d / "platform.txt", "--profile", d / "profile.json",
               "--profile", f"edge03={d / 'profile.json'}", "-o", tmp_path / "out", "--pop", 8,
               "--gens", 2)
    assert r.exit_code == 0, r.output
    # A board left out of the search may keep its profile on the command line.
    r = invoke("dse", model, "-p", d / "platform.txt", "--profile", d / "profile.json",
               "--profile", f"edge03={d / 'profile.json'}", "--hosts", "edge01,edge02", "-o",
               tmp_path / "out2", "--pop", 8, "--gens", 2)
    assert r.exit_code == 0, r.output


def test_a_profile_of_other_bytes_gets_a_note(squeeze, tmp_path):
    """Every layer name of another export (other weights, another input size) can be there:
    only the file's hash tells, and the search says so instead of pricing silently."""
    from dataclasses import replace

    from autodice.dse.profile import load_profile, model_sha256

    model, d = squeeze
    mine = replace(load_profile(d / "profile.json"), model_sha256=model_sha256(model))
    other = replace(mine, model_sha256="0" * 64)
    for profile, noted in ((mine, False), (other, True)):
        save_profile(profile, tmp_path / "p.json")
        r = invoke("dse", model, "-p", d / "platform.txt", "--profile", tmp_path / "p.json",
                   "-o", tmp_path / "out", "--pop", 8, "--gens", 2)
        assert r.exit_code == 0, r.output
        assert ("was taken of another file than" in r.output) == noted, r.output


def test_a_model_of_symbolic_size_is_searched_at_the_given_input_shape(tmp_path):
    """--input-shape as split takes it: without it every cut tensor of such a model has no
    size, and the front held one-rank mappings only."""
    onnx.save(symbolic_model(), tmp_path / "m.onnx")
    shape = {"x": (1, 4, 64, 64)}
    save_profile(fixture_profile(load_model(tmp_path / "m.onnx", shape), gflops=0.01),
                 tmp_path / "p.json")  # each Relu 1.6 ms: two boards make twice the frames
    (tmp_path / "platform.txt").write_text("a, x86, slots=0, bandwidth=10gbit\n"
                                           "b, x86, slots=0, bandwidth=10gbit\n")
    r = invoke("dse", tmp_path / "m.onnx", "-p", tmp_path / "platform.txt", "--profile",
               tmp_path / "p.json", "--input-shape", "x=1x4x64x64", "-o", tmp_path / "out",
               "--pop", 8, "--gens", 4, "--objectives", "throughput,memory")
    assert r.exit_code == 0, r.output
    mappings = [json.loads(p.read_text()) for p in (tmp_path / "out" / "mappings").iterdir()]
    assert any(len(m) == 2 for m in mappings), mappings  # the layers spread over both boards
    for m in mappings:
        (tmp_path / "m.json").write_text(json.dumps(m))
        split(tmp_path / "m.onnx", tmp_path / "m.json", tmp_path / "platform.txt",
              tmp_path / "split", shape)


@pytest.mark.parametrize("args, message", [
    (["--seed", "-1"], "--seed -1: a seed is 0 or more"),
    (["--measure", "1", "-i", "no-such-inventory.toml"],
     "no-such-inventory.toml: cannot read (No such file or directory)"),
    (["--min-fps", "nan"], "--min-fps nan: must be a finite number above 0"),
    (["--objectives", "throughput,speed"], "--objectives throughput,speed: some of "
                                           "throughput, energy, memory, each once"),
    (["--encoding", "spiral"], '--encoding "spiral": one of layer, segment'),
    (["--pop", "2"], "--pop 2: needs at least 4"),
    (["--mutation", "1.5"], "--mutation 1.5: a probability, 0..1"),
    (["--measure", "-1"], "--measure -1 --frames 100 --rounds 5: need --measure >= 0, "
                          "--frames >= 1 and --rounds >= 1"),
    (["--measure", "1", "--rounds", "0"], "--measure 1 --frames 100 --rounds 0: need "
                                          "--measure >= 0, --frames >= 1 and --rounds >= 1"),
])
def test_bad_settings_exit_2_with_one_line(squeeze, tmp_path, args, message):
    model, d = squeeze
    r = invoke("dse", model, "-p", d / "platform.txt", "--profile", d / "profile.json", "-o",
               tmp_path / "out", *args)
    assert r.exit_code == 2 and r.output.strip().splitlines() == [f"error: {message}"]
    assert not (tmp_path / "out").exists()


def test_bad_inputs_exit_2_with_one_line(squeeze, tmp_path):
    model, d = squeeze
    other = tmp_path / "fig2.onnx"
    onnx.save(figure2(), other)
    save_profile(fixture_profile(load_model(other)), tmp_path / "fig2_profile.json")
    (tmp_path / "tiny.txt").write_text("a, arm, slots=0-1, mem=1MB\n")
    cases = [
        (["--profile", tmp_path / "missing.json"], "missing.json: cannot read"),
        (["--profile", tmp_path / "fig2_profile.json"], "layers of"),
        (["--profile", d / "profile.json", "-p", tmp_path / "tiny.txt"],
         "no mapping found that meets each device's mem"),
        (["--profile", d / "profile.json", "--profile", f"edge09={d / 'profile.json'}"],
         'profile for host "edge09": no such host'),
        (["--profile", f"edge01={d / 'profile.json'}"], "no profile for edge02, edge03"),
    ]
    for extra, message in cases:
        args = ["-p", d / "platform.txt", *extra] if "-p" not in extra else extra
        r = invoke("dse", model, *args, "-o", tmp_path / "out", "--pop", 8, "--gens", 2)
        lines = r.output.strip().splitlines()
        assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), r.output
        assert message in lines[0], lines[0]
        assert not (tmp_path / "out").exists()


@pytest.mark.cpp
def test_measure_reruns_front_points(tmp_path, monkeypatch):
    # A power chip reporting 5 W stands in for a sensor (this machine has none): a tree in
    # hwmon's layout, read through AUTODICE_SYSFS.
    hwmon = tmp_path / "sys/class/hwmon/hwmon0"
    hwmon.mkdir(parents=True)
    (hwmon / "name").write_text("test-psu\n")
    (hwmon / "power1_input").write_text("5000000\n")
    monkeypatch.setenv("AUTODICE_SYSFS", str(tmp_path / "sys"))
    onnx.save(figure2(), tmp_path / "model.onnx")
    (tmp_path / "platform.txt").write_text("here, x86, slots=0-1, power_idle=5W, power_cpu=2W\n")
    save_profile(fixture_profile(load_model(tmp_path / "model.onnx")), tmp_path / "profile.json")
    r = invoke("dse", tmp_path / "model.onnx", "-p", tmp_path / "platform.txt", "--profile",
               tmp_path / "profile.json", "-o", tmp_path / "out", "--pop", 8, "--gens", 3,
               "--measure", 1, "--frames", 5, "--rounds", 3, "--pace")
    assert r.exit_code == 0, r.output
    assert "predicted vs measured" in r.output and "pace" in r.output, r.output
    (m,) = json.loads((tmp_path / "out" / "measure.json").read_text())
    assert m["point"] == "p00" and m["frames"] == 5 and m["where"] == "here"
    assert len(m["runs_fps"]) == 3 and m["measured_fps"] == sorted(m["runs_fps"])[1]
    assert m["measured_fps"] > 0 and m["predicted_fps"] > 0 and m["measured_peak_rss_bytes"] > 0
    assert m["fps_error"] == pytest.approx(m["measured_fps"] / m["predicted_fps"] - 1, rel=1e-3)
    # Measured is each run's rate with its pipeline full, as predicted; the whole run's beside.
    last = json.loads((tmp_path / "out" / "measure" / "p00" / "results" / "stats.json").read_text())
    assert m["runs_fps"][-1] == pytest.approx(last["steady_fps"], rel=1e-5)
    assert m["runs_fps_with_fill"][-1] == pytest.approx(last["fps"], rel=1e-5)
    # The energy objective checked: this machine's sensor over each run, against the model's
    # sum over the hosts (all ran here), from platform.txt's watts.
    e = m["energy"]["here"]
    assert "energy per frame, predicted vs measured" in r.output, r.output
    assert e["sensor"] == "hwmon:test-psu" and e["predicted_j_per_frame"] > 0
    assert e["error"] == pytest.approx(e["measured_j_per_frame"] / e["predicted_j_per_frame"] - 1,
                                       rel=1e-3)
    ran = last["energy"][socket.gethostname()]
    assert ran["joules"] == pytest.approx(5.0 * ran["seconds"]) and ran["seconds"] > 0
    assert ran["joules_per_frame"] == pytest.approx(5.0 * last["seconds"] / 5)
    # --pace: each round also ran the whole model alone on one core of the host; its frames/s
    # over what the model predicts for it is the host's pace; the point's rounds at that pace.
    mapping = json.loads((tmp_path / "out" / "measure" / "pace" / "here.json").read_text())
    point = json.loads((tmp_path / "out" / "mappings" / "p00.json").read_text())
    assert list(mapping) == ["here_x860"]
    assert sorted(mapping["here_x860"]) == sorted(n for layers in point.values() for n in layers)
    alone = m["hosts_pace"]["here"]
    alone_last = json.loads((tmp_path / "out" / "measure" / "pace" / "here" / "results" /
                             "stats.json").read_text())
    assert len(alone["runs_fps"]) == 3 and alone["predicted_fps"] > 0
    assert alone["runs_fps"][-1] == pytest.approx(alone_last["steady_fps"], rel=1e-5)
    assert m["runs_pace"] == pytest.approx([f / alone["predicted_fps"] for f in alone["runs_fps"]],
                                           rel=1e-4)
    assert m["paced_fps"] == pytest.approx(
        np.median([f / p for f, p in zip(m["runs_fps"], m["runs_pace"])]), rel=1e-4)
    assert m["paced_fps_error"] == pytest.approx(m["paced_fps"] / m["predicted_fps"] - 1,
                                                 rel=1e-3)


@pytest.mark.cpp
def test_measure_prices_a_point_that_splits_a_layer_as_dse_did(tmp_path):
    """A front point with a layer split across keys is priced with the model as the split
    rewrote it (the parts' names): priced with the model as given, it was a KeyError after the
    point was built."""
    import autodice
    from autodice.dse.measure import measure

    onnx.save(figure2(), tmp_path / "model.onnx")
    (tmp_path / "platform.txt").write_text("here, x86, slots=0-1\n")
    profile = fixture_profile(load_model(tmp_path / "model.onnx"))
    rows = {"layer": "Conv1", "split": "rows"}
    mapping = {"here_x860": ["MaxPool1", rows, "Add1", "Relu1", "FC1"], "here_x861": [rows]}
    front = tmp_path / "front"
    autodice.search(tmp_path / "model.onnx", tmp_path / "platform.txt", profile, pop=8, gens=2,
                    out=front)
    fastest = json.loads((front / "pareto.json").read_text())["points"][0]["point"]
    (front / "mappings" / f"{fastest}.json").write_text(json.dumps(mapping))  # as if proposed
    (m,) = measure(front, tmp_path / "model.onnx", tmp_path / "platform.txt", profile, 1,
                   frames=5, rounds=1)
    want = autodice.predict(tmp_path / "model.onnx", profile, mapping, tmp_path / "platform.txt")
    assert m.predicted_fps == pytest.approx(want.throughput) and m.measured_fps > 0
    assert len(want.ranks) == 2


def test_a_recovery_takes_the_fastest_front_point_on_the_hosts_left(squeeze_out):
    """After losing a host, a session started with ``recover=FRONT`` deploys the front's
    fastest point that uses only the hosts left and keeps the input where it was."""
    from autodice.core.mapping import parse_key
    from autodice.deploy.recover import front_point

    _, front = squeeze_out
    doc = json.loads((front / "pareto.json").read_text())
    points = [(float(p["throughput_fps"]), json.loads((front / p["mapping"]).read_text()))
              for p in doc["points"]]
    heads = [parse_key(next(iter(m))).host for _, m in points]
    head = max(set(heads), key=heads.count)
    chosen = 0
    for left in ({"edge01", "edge02", "edge03"} - {lost} for lost in ("edge01", "edge02",
                                                                       "edge03")):
        fits = [(fps, m) for fps, m in points
                if parse_key(next(iter(m))).host == head
                and {parse_key(k).host for k in m} <= left]
        found = front_point(front, left, head)
        if not fits:
            assert found is None
            continue
        mapping, why = found
        assert mapping in [m for _, m in fits]
        assert max(fps for fps, _ in fits) == next(fps for fps, m in fits if m == mapping)
        assert why.startswith("the DSE front's fastest point on ")
        chosen += 1
    assert chosen  # the front has a point on two of the three hosts


def test_a_measured_point_whose_gpu_ranks_ran_on_lavapipe_says_so():
    """An emulated cluster's hosts (and a board without its GPU's driver) run GPU ranks on
    Mesa's lavapipe: the measured frames/s are not a GPU's, and the notes say which device."""
    from autodice.dse.measure import _measure_notes

    device = "vulkan:llvmpipe (LLVM 15.0.6, 256 bits)"
    assert _measure_notes(None, 2, 0.0, "inventory.toml", {device, "vulkan:NVIDIA H100"}) == [
        f"GPU ranks ran on {device}: Vulkan on the CPU (Mesa's lavapipe), not a GPU's speed"]
    assert _measure_notes(None, 2, 0.0, "inventory.toml", {"vulkan:NVIDIA H100"}) == []
