import json

import pytest

from autodice.core.errors import AutodiceError
from autodice.core.mapping import cpu_key, mapping_from, parse_key, parse_keys, parse_mapping_text
from autodice.core.spec import parse_cores, parse_platform_text


@pytest.mark.parametrize("key, host, kind, cores, gpu", [
    ("edge01_arm123", "edge01", "cpu", (1, 2, 3), 0),
    ("edge01_gpu", "edge01", "gpu", (), 0),
    ("edge01_gpu0", "edge01", "gpu", (), 0),
    ("my_board_2_x860", "my_board_2", "cpu", (0,), 0),
    ("edge04_cpu0-11", "edge04", "cpu", tuple(range(12)), 0),
    ("edge04_cpu1,3,5", "edge04", "cpu", (1, 3, 5), 0),
    ("edge04_cpu0-2,8", "edge04", "cpu", (0, 1, 2, 8), 0),
])
def test_parse_key(key, host, kind, cores, gpu):
    r = parse_key(key)
    assert (r.host, r.kind, r.cores, r.gpu_index) == (host, kind, cores, gpu)


@pytest.mark.parametrize("key", ["edge01", "_arm1", "edge01_arm", "edge01_tpu", "edge01_arm11",
                                 "edge01_cpu3-1", "edge01_gpux"])
def test_parse_key_rejects(key):
    with pytest.raises(ValueError):
        parse_key(key)


@pytest.mark.parametrize("cores, key", [((0,), "b_x860"), ((1, 2, 3), "b_x86123"),
                                        ((0, 1, 11), "b_x860-1,11-11"),
                                        (tuple(range(12)), "b_x860-11")])
def test_cpu_key_is_what_parse_key_reads(cores, key):
    assert cpu_key("b", "x86", cores) == key
    assert parse_key(key).cores == cores


def test_a_mapping_parses_its_keys_once_and_keeps_the_bad_ones_for_the_platform_check():
    m = parse_mapping_text('{"e1_x8601": ["a"], "e2_gpu": ["b"], "e1_tpu": ["c"]}')
    assert [r.kind for r in m.resources.values()] == ["cpu", "gpu"]
    assert m.hosts() == ["e1", "e2"]
    assert m.bad_keys == {
        "e1_tpu": 'resource "tpu" is not cpu|arm|x86 followed by cores, or gpu[N]'}


def test_a_mapping_given_as_data_is_the_mapping_its_text_is():
    data = {"e1_x860": ["a", {"layer": "fc", "split": "rows", "share": 0.25}],
            "e2_x860": {"replicates": "e1_x860"}}
    assert mapping_from(data, "m") == parse_mapping_text(json.dumps(data), "m")
    with pytest.raises(AutodiceError, match='m: key "e1_x860": lists no layers'):
        mapping_from({"e1_x860": []}, "m")
    with pytest.raises(AutodiceError, match="m: key 3 is not a string"):
        mapping_from({3: ["a"]}, "m")


def test_keys_given_one_by_one_are_refused_together():
    assert [r.host for r in parse_keys(["a_x860", "b_gpu"], "--balance")] == ["a", "b"]
    with pytest.raises(AutodiceError) as e:
        parse_keys(["a_x860", "a_tpu", 7, "a_x860"], "--balance")
    assert e.value.problems == [
        '--balance: key "a_tpu": resource "tpu" is not cpu|arm|x86 followed by cores, or gpu[N]',
        '--balance: key "7": not a string', '--balance: key "a_x860" is given 2 times']


def test_parse_cores():
    assert parse_cores("0-5") == (0, 1, 2, 3, 4, 5)
    assert parse_cores("0-1;4") == (0, 1, 4)
    with pytest.raises(ValueError):
        parse_cores("1,1")


def test_parse_platform_fields():
    p = parse_platform_text(
        "# comment\n"
        "edge01, arm, slots=0-5, gpu=NVIDIAVolta (CUDA), mem=8GB  # trailing\n"
        "\n"
        "edge04, x86, slots=0-11, gpu=AMDRX6800 (VULKAN), bandwidth=1gbit, latency=0.2ms, "
        "power_idle=12W, power_cpu=3.5W, power_gpu=150W, gpu_mem=16GiB\n"
        "edge05, ARM, slots=0-3, machine=rack 2\n")
    e1, e4, e5 = p.devices.values()
    assert (e1.name, e1.arch, e1.slots, e1.gpu, e1.gpu_api, e1.mem) == (
        "edge01", "arm", (0, 1, 2, 3, 4, 5), "NVIDIAVolta", "CUDA", 8e9)
    assert e4.bandwidth == 125e6 and e4.latency == pytest.approx(2e-4)
    assert (e4.power_idle, e4.power_cpu, e4.power_gpu, e4.gpu_mem) == (12, 3.5, 150, 16 * 2**30)
    assert e5.gpu is None and e5.arch == "arm"
    assert (e1.machine, e5.machine) == (None, "rack 2")


def test_platform_reports_every_problem_at_once():
    with pytest.raises(AutodiceError) as e:
        parse_platform_text("a, arm, slots=0-3, ram=4GB\nb, mips, slots=0\nc, arm\n"
                            "d, arm, slots=0, machine=\n", "p.txt")
    text = str(e.value)
    assert len(e.value.problems) == 4
    assert 'p.txt:4: device "d": machine=: empty' in text
    assert 'p.txt:1: device "a": unknown field "ram=4GB"' in text and "mem (RAM" in text
    assert 'p.txt:2: device "b": arch "mips"' in text
    assert "p.txt:3" in text


def test_mapping_keeps_key_order():
    m = parse_mapping_text('{"z_gpu": ["a"], "a_arm1": ["b", "c"]}')
    assert m.entries == (("z_gpu", ("a",)), ("a_arm1", ("b", "c")))
