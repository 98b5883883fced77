"""A deployed board's sensors as a copy here (autodice/deploy/board_figures.py): the scripts
run by a real ``sh`` on trees in real boards' layouts (test_power.py's), with a stand-in
``vcgencmd`` on PATH for a Pi, then read by the same readers as this machine's. Here the
"board" is this machine reached without ssh; over ssh, on the emulated cluster:
tests/test_cluster.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from test_power import PI5, jetson, rapl_tree, write

from autodice.backend.host_files import HostFiles
from autodice.backend.power import find_sensor, parse_pmic
from autodice.backend.thermal import clocks, temperatures, throttled
from autodice.deploy.board_figures import ONCE, BoardWatch, write_snapshot


def snapshot(sysfs: Path, into: Path, path_dirs: str = "/usr/bin:/bin") -> HostFiles:
    """The script's output on a board whose sysfs is ``sysfs``, copied into ``into``."""
    out = subprocess.run(["sh", "-c", ONCE, "sh", str(sysfs), ""], capture_output=True,
                         text=True, check=True, env={"PATH": path_dirs})
    said = write_snapshot(out.stdout, into)
    return HostFiles(into, said.get)


def test_a_jetsons_copy_reads_as_the_board_itself(tmp_path):
    board = jetson(tmp_path / "board")
    t, c = "sys/class/thermal", "sys/devices/system/cpu"
    write(board, {f"{t}/thermal_zone0/type": "CPU-therm", f"{t}/thermal_zone0/temp": "48500",
                  f"{c}/cpu0/cpufreq/scaling_cur_freq": "1510400"})
    there = HostFiles(board / "sys")
    copy = snapshot(board / "sys", tmp_path / "copy")
    sensor, same = find_sensor(there), find_sensor(copy)
    assert same.name == sensor.name == "hwmon:ina3221 VDD_IN"
    assert same.read() == pytest.approx(sensor.read())
    assert temperatures(copy) == temperatures(there) == {"CPU-therm": 48.5}
    assert clocks(copy) == {0: 1510400e3}
    # the next copy replaces the values: a counter that moved is read as moved
    (board / "sys/class/hwmon/hwmon1/curr1_input").write_text("2400\n")
    snapshot(board / "sys", tmp_path / "copy")
    assert same.read() == pytest.approx(5.080 * 2.400)


def test_an_x86_boards_rapl_counter_moves_in_the_copy(tmp_path):
    board = rapl_tree(tmp_path / "board", psys=True)
    copy = snapshot(board / "sys", tmp_path / "copy")
    sensor = find_sensor(copy)
    assert sensor.name == "rapl:psys" and sensor.counter and sensor.read() == 0.0
    (board / "sys/class/powercap/intel-rapl:1/energy_uj").write_text("9500000\n")
    snapshot(board / "sys", tmp_path / "copy")
    assert sensor.read() == pytest.approx(2.5)


def test_a_pis_vcgencmd_answers_come_with_the_copy(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "vcgencmd"  # prints what a Pi 5's firmware prints
    fake.write_text('#!/bin/sh\ncase "$1" in\n  pmic_read_adc) cat <<EOF\n' + PI5 +
                    'EOF\n  ;;\n  get_throttled) echo throttled=0x50005 ;;\nesac\n')
    fake.chmod(0o755)
    copy = snapshot(tmp_path / "sys", tmp_path / "copy", f"{bin_dir}:/usr/bin:/bin")
    sensor = find_sensor(copy)
    assert sensor.name.startswith("pmic:") and sensor.read() == pytest.approx(parse_pmic(PI5))
    assert throttled(copy)["now"]["under_voltage"] is True


def test_what_a_board_prints_cannot_leave_the_copy(tmp_path):
    said = write_snapshot("../../escape\t1\n/etc/x\t2\nclass/thermal/thermal_zone0/type\tcpu\n"
                          "@get_throttled\n throttled=0x0\n", tmp_path / "copy")
    assert said == {"get_throttled": "throttled=0x0\n"}
    assert not (tmp_path / "escape").exists() and not (tmp_path / "copy/etc").exists()
    assert (tmp_path / "copy/class/thermal/thermal_zone0/type").read_text() == "cpu\n"


def test_a_board_with_no_sysfs_gives_nothing(tmp_path):
    copy = snapshot(tmp_path / "absent", tmp_path / "copy")
    assert find_sensor(copy) is None and temperatures(copy) == {} and throttled(copy) is None


class Here:
    """Deploy's Ssh, but each command runs on this machine, as on a board that shares it."""

    def cmd(self, target, *argv):
        return list(argv)

    def open(self, target, *argv, timeout):
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)


def test_a_board_followed_through_a_stream_then_read_once_more(tmp_path, monkeypatch):
    """One session per board: readings every 0.1 s while frames flow (energy counted from the
    first frame), one reading more at the end, and the script on the board gone after it."""
    import time
    from types import SimpleNamespace

    monkeypatch.setenv("AUTODICE_SYSFS", str(jetson(tmp_path) / "sys"))
    frames = [0]
    watch = BoardWatch(Here(), [SimpleNamespace(target=SimpleNamespace(host="jetson1"))],
                       every_s=0.1)
    (figures,) = watch.hosts
    watch.start(lambda: frames[0])
    deadline = time.monotonic() + 10
    while figures.energy.sensor is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert figures.energy.sensor.name == "hwmon:ina3221 VDD_IN"
    assert figures.energy.seconds == 0  # no frame yet: no energy counted
    frames[0] = 10
    time.sleep(0.6)
    frames[0] = 30
    pid = int(watch._boards[0]._pid)
    watch.close()
    (report,) = watch.report().values()
    assert report["seconds"] >= 0.3 and report["frames"] == 20
    assert report["joules"] == pytest.approx(5.080 * 1.200 * report["seconds"])
    with pytest.raises(ProcessLookupError):  # the following script ended with the last reading
        for _ in range(50):
            os.kill(pid, 0)
            time.sleep(0.1)


def test_a_first_reading_may_come_before_the_session_has_counted_a_frame():
    """The boards start reading as the session's figures are made; a reading that came at once
    asked for the frames delivered before there was a count (a thread's AttributeError)."""
    from autodice.backend.session.figures import Figures

    class Eager:
        hosts: list = []

        def start(self, frames):
            self.seen = frames()

        def close(self):
            pass

    eager = Eager()
    Figures(boards=eager).close()
    assert eager.seen == 0
