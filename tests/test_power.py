"""Power sensors (autodice/backend/power.py), temperatures, clocks and throttling
(autodice/backend/thermal.py), read from trees in the formats real boards use.

This machine has no sensor (no /sys/class/hwmon, no /sys/class/powercap), so the readers are
tested on trees the tests write, each laid out as the kernel lays out that board's:

- a Jetson (JetPack 5 or later): the INA3221 as hwmon, ``name`` ina3221, rails ``in1..3`` with
  ``in*_label`` (VDD_IN, VDD_CPU_GPU_CV, VDD_SOC), ``in*_input`` in mV, ``curr*_input`` in mA;
- a GPU or PMBus chip reporting power itself: hwmon ``power1_average`` in microwatts;
- x86: powercap's ``intel-rapl:N`` zones (``name``, ``energy_uj``, ``max_energy_range_uj``),
  subzones ``intel-rapl:N:M`` beside them, ``psys`` where the platform has it;
- a Raspberry Pi 5: ``vcgencmd pmic_read_adc``, one line per rail, ``NAME_A current(k)=...A``
  and ``NAME_V volt(k)=...V`` (the layout Pi 5 users post; the figures here are made up);
- thermal zones (``thermal_zoneN/type``, ``temp`` in millidegrees) and cpufreq's
  ``scaling_cur_freq`` (kHz), and a Pi's ``vcgencmd get_throttled`` (``throttled=0x50005``).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from autodice.backend.host_files import HostFiles
from autodice.backend.power import (
    NO_SENSOR,
    EnergyMeter,
    Sensor,
    find_sensor,
    hwmon,
    parse_pmic,
    rapl,
)
from autodice.backend.session.figures import Figures
from autodice.backend.thermal import clocks, host_families, parse_throttled, temperatures


def at(root: Path, vcgencmd=None) -> HostFiles:
    """The files of a board whose filesystem is ``root``."""
    return HostFiles(root / "sys", vcgencmd or (lambda command: None))


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text + "\n")
    return root


def jetson(root: Path) -> Path:
    h = "sys/class/hwmon"
    return write(root, {
        f"{h}/hwmon0/name": "soc_thermal", f"{h}/hwmon0/temp1_input": "41000",
        f"{h}/hwmon1/name": "ina3221",
        f"{h}/hwmon1/in1_label": "VDD_IN", f"{h}/hwmon1/in1_input": "5080",
        f"{h}/hwmon1/curr1_input": "1200",
        f"{h}/hwmon1/in2_label": "VDD_CPU_GPU_CV", f"{h}/hwmon1/in2_input": "5072",
        f"{h}/hwmon1/curr2_input": "400",
        f"{h}/hwmon1/in3_label": "VDD_SOC", f"{h}/hwmon1/in3_input": "5076",
        f"{h}/hwmon1/curr3_input": "520"})


def test_a_jetsons_ina3221_gives_the_boards_input_rail(tmp_path):
    sensor = find_sensor(at(jetson(tmp_path)))
    assert sensor.name == "hwmon:ina3221 VDD_IN" and not sensor.counter
    assert sensor.read() == pytest.approx(5.080 * 1.200)
    # without a VDD_IN label, every rail summed, each named
    (tmp_path / "sys/class/hwmon/hwmon1/in1_label").write_text("VIN_SYS\n")
    sensor = hwmon(at(tmp_path))
    assert sensor.name == "hwmon:ina3221 VIN_SYS+VDD_CPU_GPU_CV+VDD_SOC"
    assert sensor.read() == pytest.approx(5.080 * 1.2 + 5.072 * 0.4 + 5.076 * 0.52)


def test_a_chip_that_reports_power_itself(tmp_path):
    write(tmp_path, {"sys/class/hwmon/hwmon3/name": "amdgpu",
                     "sys/class/hwmon/hwmon3/power1_average": "15250000"})
    sensor = find_sensor(at(tmp_path))
    assert sensor.name == "hwmon:amdgpu" and sensor.read() == pytest.approx(15.25)


def rapl_tree(root: Path, psys: bool) -> Path:
    p = "sys/class/powercap"
    files = {f"{p}/intel-rapl:0/name": "package-0", f"{p}/intel-rapl:0/energy_uj": "1000000",
             f"{p}/intel-rapl:0/max_energy_range_uj": "262143328850",
             f"{p}/intel-rapl:0:0/name": "core", f"{p}/intel-rapl:0:0/energy_uj": "5"}
    if psys:
        files |= {f"{p}/intel-rapl:1/name": "psys", f"{p}/intel-rapl:1/energy_uj": "7000000",
                  f"{p}/intel-rapl:1/max_energy_range_uj": "262143328850"}
    return write(root, files)


def test_rapl_prefers_the_platform_zone_and_counts_across_a_wrap(tmp_path):
    assert find_sensor(at(rapl_tree(tmp_path / "a", psys=True))).name == "rapl:psys"
    root = rapl_tree(tmp_path / "b", psys=False)
    sensor = rapl(at(root))
    assert sensor.name == "rapl:package-0" and sensor.counter and sensor.read() == 0.0
    counter = root / "sys/class/powercap/intel-rapl:0/energy_uj"
    counter.write_text("262143000000\n")  # 262,142 J later
    assert sensor.read() == pytest.approx(262142.0)
    counter.write_text("671150\n")  # past the range: started again from 0
    assert sensor.read() == pytest.approx(262142.0 + 262143328850e-6 - 262143.0 + 0.67115)


def test_no_readable_sensor_is_none(tmp_path):
    write(tmp_path, {"sys/class/powercap/intel-rapl:0/name": "package-0",
                     "sys/class/hwmon/hwmon0/name": "coretemp",
                     "sys/class/hwmon/hwmon0/temp1_input": "50000"})  # no energy_uj: root-only
    assert find_sensor(at(tmp_path)) is None


PI5 = """\
     3V7_WL_SW_A current(0)=0.00390372A
       3V3_SYS_A current(1)=0.05660760A
      VDD_CORE_A current(7)=0.71962000A
     3V7_WL_SW_V volt(8)=3.74237100V
       3V3_SYS_V volt(9)=3.31684300V
      VDD_CORE_V volt(15)=0.72000000V
         EXT5V_V volt(24)=5.14800000V
"""


def test_a_pi5s_pmic_rails_are_summed():
    want = 0.00390372 * 3.742371 + 0.0566076 * 3.316843 + 0.71962 * 0.72
    assert parse_pmic(PI5) == pytest.approx(want)  # EXT5V has no current: left out
    assert parse_pmic("VDD_CORE_V=0.8750V\nVDD_CORE_A=1.2340A\n") == pytest.approx(0.875 * 1.234)
    assert parse_pmic("error=2 error_msg=\"Command not registered\"") is None


def test_a_pi5s_pmic_is_its_sensor(tmp_path):
    sensor = find_sensor(at(tmp_path, {"pmic_read_adc": PI5}.get))
    assert sensor.name.startswith("pmic:vcgencmd") and not sensor.counter
    assert sensor.read() == pytest.approx(parse_pmic(PI5))
    assert find_sensor(at(tmp_path, {"pmic_read_adc": "error=2"}.get)) is None


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_power_is_integrated_and_a_missed_reading_is_no_made_up_joule():
    clock, watts = Clock(), iter([4.0, 6.0, OSError("i2c busy"), 6.0])

    def read():
        w = next(watts)
        if isinstance(w, Exception):
            raise w
        return w

    meter = EnergyMeter(Sensor("hwmon:test", False, read), every_s=0.2, clock=clock)
    for t, frames in ((0.0, 1), (0.1, 2), (0.5, 5), (1.0, 9), (1.5, 12)):
        clock.t = t
        meter.sample(frames)  # 0.1: too soon; 1.0: the read fails
    assert meter.joules == pytest.approx((4 + 6) / 2 * 0.5 + 6 * 1.0)
    report = meter.report()
    assert report["frames"] == 11 and report["joules_per_frame"] == pytest.approx(8.5 / 11)
    assert report["seconds"] == pytest.approx(1.5) and report["sensor"] == "hwmon:test"
    # a job's own loop: its frames took 0.5 s of the 1.5 metered, at 17/3 W on average
    assert meter.report(10, busy_s=0.5)["joules_per_frame"] == pytest.approx(8.5 / 1.5 * 0.5 / 10)


def test_stats_name_the_sensor_or_say_there_is_none():
    """A session's stats.json speaks of this machine's energy as it is: here, no sensor."""
    figures = Figures(energy=EnergyMeter(find_sensor()))
    figures.delivered_one(figures._clock(), True)
    energy = figures.stats(4, "socket", False, None)["energy"][socket.gethostname()]
    if find_sensor() is None:
        assert energy == {"sensor": None, "note": NO_SENSOR}
    else:
        assert energy["sensor"] and energy["joules"] >= 0


def test_temperatures_and_clocks_as_a_jetson_lays_them_out(tmp_path):
    t, c = "sys/class/thermal", "sys/devices/system/cpu"
    write(tmp_path, {f"{t}/thermal_zone0/type": "CPU-therm", f"{t}/thermal_zone0/temp": "48500",
                     f"{t}/thermal_zone1/type": "GPU-therm", f"{t}/thermal_zone1/temp": "46000",
                     f"{t}/thermal_zone10/type": "CPU-therm", f"{t}/thermal_zone10/temp": "50250",
                     f"{t}/thermal_zone2/type": "PMIC-Die", f"{t}/thermal_zone2/temp": "",
                     f"{c}/cpu0/cpufreq/scaling_cur_freq": "1510400",
                     f"{c}/cpu1/cpufreq/scaling_cur_freq": "729600", f"{c}/cpufreq/x": ""})
    assert temperatures(at(tmp_path)) == {"CPU-therm": 48.5, "GPU-therm": 46.0,
                                          "CPU-therm_1": 50.25}
    assert clocks(at(tmp_path)) == {0: 1510400e3, 1: 729600e3}
    from prometheus_client import CollectorRegistry, generate_latest

    class Host:
        def collect(self):
            return host_families([("edge01", at(tmp_path))])

    registry = CollectorRegistry()
    registry.register(Host())
    text = generate_latest(registry).decode()
    assert 'autodice_host_temperature_celsius{host="edge01",zone="GPU-therm"} 46.0' in text
    assert 'autodice_host_cpu_clock_hertz{cpu="1",host="edge01"} 7.296e+08' in text
    assert "throttled" not in text  # not a Pi: nothing said, not a made-up 0


def test_a_pis_throttling_bits():
    state = parse_throttled("throttled=0x50005\n")
    assert state["now"] == {"under_voltage": True, "frequency_capped": False, "throttled": True,
                            "soft_temperature_limit": False}
    assert state["since_boot"] == {"under_voltage": True, "frequency_capped": False,
                                   "throttled": True, "soft_temperature_limit": False}
    assert parse_throttled("throttled=0x0")["since_boot"]["throttled"] is False
    assert parse_throttled("VCHI initialization failed") is None
    from prometheus_client import CollectorRegistry, generate_latest

    class Pi:
        def collect(self):
            return host_families([("pi5", at(Path("/nonexistent"),
                                             {"get_throttled": "throttled=0x50005\n"}.get)),
                                  ("edge01", at(Path("/nonexistent")))])

    registry = CollectorRegistry()
    registry.register(Pi())
    text = generate_latest(registry).decode()
    assert 'autodice_host_throttled{host="pi5",reason="under_voltage",when="now"} 1.0' in text
    assert 'autodice_host_throttled{host="pi5",reason="frequency_capped",when="since_boot"} 0.0' \
        in text
    assert text.count("# TYPE autodice_host_throttled gauge") == 1 and 'host="edge01"' not in text


@pytest.mark.cpp
def test_a_repeated_run_meters_its_energy_while_the_job_runs(fig2_built, tmp_path, monkeypatch):
    """``run`` (the program's own loop, no session) reads the sensor while the job runs and
    writes joules a frame into stats.json; here a sensor that reads 5 W stands in for one."""
    import numpy as np

    import autodice.backend.run as local_run

    monkeypatch.setattr(local_run, "find_sensor", lambda: Sensor("hwmon:test", False, lambda: 5.0))
    np.save(tmp_path / "x.npy", np.zeros((1, 4, 8, 8), np.float32))
    res = local_run.run(fig2_built / "out", {"input": tmp_path / "x.npy"}, frames=30000,
                        results=tmp_path / "r")
    energy = json.loads((tmp_path / "r" / "stats.json").read_text())["energy"]
    e = energy[socket.gethostname()]
    assert e["sensor"] == "hwmon:test" and e["frames"] == res.stats["frames"] == 30000
    assert e["seconds"] > 0.2 and e["joules"] == pytest.approx(5.0 * e["seconds"])
    # a frame's share: the mean power over the frames' own seconds, not the job's start
    assert e["joules_per_frame"] == pytest.approx(5.0 * res.stats["seconds"] / 30000)
    assert e["joules_per_frame"] < e["joules"] / 30000
