"""Each deployed board's power, temperatures, clocks and throttling, read over ssh while its job
runs, so a session's /metrics and stats.json speak of every board as they do of this machine.

A board's sensors are files in its sysfs and a Pi's ``vcgencmd``, the ones a local run reads
(:mod:`autodice.backend.power`, :mod:`autodice.backend.thermal`). A small shell script on each
board (:data:`SENSORS`: POSIX sh, builtins only for the files, nothing to install there) prints
them, with vcgencmd's answers, about every second (:data:`EVERY_S`) through one ssh session held
for the whole job, not an ssh command each second (a process start on both ends each time).
Following two emulated boards keeps 0.33 % of this 2-core machine's cores busy, and a deployed
SqueezeNet session keeps its frames/s (bench/boards_bench.py).

Each reading is written here, in sysfs's own layout, into a folder of the board's, and the same
readers read that folder: one reader for every host, and a board's sensor is found exactly as
this machine's is. At the end one reading more (through the host's master connection) takes the
energy to the stream's last result and ends the script there. A board that stops answering is
followed again a second later; a reading missed makes a longer integration step, never a
made-up one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath

from ..backend.host_files import HostFiles, sysfs_folder
from ..backend.power import EnergyMeter, find_sensor
from ..backend.session.figures import HostFigures
from ..core.names import file_slug
from .inventory import Target
from .ssh import Host, Ssh

EVERY_S = 1.0  # seconds between two readings of a board
_TIMEOUT_S = 5.0  # the last reading of a board that takes longer is left out

# ``snapshot SYSFS``: one "path<TAB>value" line per readable file (paths relative to SYSFS), then
# for each vcgencmd command a line "@command" and its answer, each line indented by a space, then
# an empty line. Builtins only in the loop over files: no process per file.
SENSORS = r"""
snapshot() {
  for f in "$1"/class/powercap/intel-rapl:*/name "$1"/class/powercap/intel-rapl:*/energy_uj \
      "$1"/class/powercap/intel-rapl:*/max_energy_range_uj "$1"/class/hwmon/hwmon*/name \
      "$1"/class/hwmon/hwmon*/power*_input "$1"/class/hwmon/hwmon*/power*_average \
      "$1"/class/hwmon/hwmon*/in*_input "$1"/class/hwmon/hwmon*/in*_label \
      "$1"/class/hwmon/hwmon*/curr*_input "$1"/class/thermal/thermal_zone*/type \
      "$1"/class/thermal/thermal_zone*/temp \
      "$1"/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq; do
    v=
    [ -r "$f" ] && { IFS= read -r v < "$f"; } 2>/dev/null
    [ -n "$v" ] && printf '%s\t%s\n' "${f#"$1"/}" "$v"
  done
  if command -v vcgencmd >/dev/null 2>&1; then
    for c in pmic_read_adc get_throttled; do
      printf '@%s\n' "$c"
      vcgencmd "$c" 2>/dev/null | sed 's/^/ /'
    done
  fi
  echo
}
"""
# $1 sysfs, $2 seconds: "pid PID", then a reading every $2 s until the session's pipe closes.
FOLLOW = SENSORS + 'echo "pid $$"\nwhile :; do snapshot "$1"; sleep "$2"; done\n'
# $1 sysfs, $2 the following script's pid or "": that script ended, then one reading.
ONCE = SENSORS + 'case "$2" in *[!0-9]*|"") ;; *) kill "$2" 2>/dev/null ;; esac\nsnapshot "$1"\n'


def write_snapshot(text: str, into: Path, known: dict[str, str] | None = None
                   ) -> dict[str, str]:
    """A reading as files under ``into`` (each replaced whole, so a reader never sees half a
    value); returns vcgencmd's answers by command. ``known``: what was written before, by path,
    kept up to date here: only a value that changed is written again (most files say the same
    each second, and writing them all cost 7 ms of Python a reading). A path that would leave
    ``into`` is skipped: what a board prints is data."""
    known = {} if known is None else known
    said: dict[str, list[str]] = {}
    command = None
    for line in text.splitlines():
        if not line:
            continue  # a reading's end
        if line.startswith("@"):
            command = line[1:]
            said[command] = []
        elif command is not None:
            said[command].append(line[1:])
        elif "\t" in line:
            rel, value = line.split("\t", 1)
            if known.get(rel) == value:
                continue
            parts = PurePosixPath(rel).parts
            if not parts or rel.startswith("/") or ".." in parts:
                continue
            path = into.joinpath(*parts)
            if rel not in known:
                path.parent.mkdir(parents=True, exist_ok=True)
            part = path.with_name(path.name + ".part")
            part.write_text(value + "\n")
            os.replace(part, path)
            known[rel] = value
    return {c: "\n".join(lines) + "\n" for c, lines in said.items()}


class BoardCopy:
    """One board's copy of its sensor files, refreshed by each reading."""

    def __init__(self, target: Target, folder: Path):
        self.target, self.folder = target, folder
        self.said: dict[str, str] = {}
        self.files = HostFiles(folder, lambda command: self.said.get(command))
        self._known: dict[str, str] = {}  # the copy's values, by path
        self.answered = True  # the last reading came
        self.found = False  # its sensor was looked for in a copy
        self._pid = ""  # the following script's, on the board
        self._proc: subprocess.Popen | None = None

    def follow(self, ssh: Ssh, sysfs: str, every_s: float, copied: Callable[[], None],
               stop: threading.Event) -> None:
        """A reading every ``every_s`` seconds through one ssh session, ``copied`` after each,
        until :meth:`unfollow` or the board goes."""
        if stop.is_set():
            return
        try:
            self._proc = proc = subprocess.Popen(
                ssh.cmd(self.target, "sh", "-c", FOLLOW, "sh", sysfs, f"{every_s:g}"),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True)
        except OSError:
            self.answered = False
            return
        lines: list[str] = []
        try:
            for line in proc.stdout:
                if stop.is_set():
                    break
                if line.startswith("pid ") and not lines:
                    self._pid = line[4:].strip()
                elif line == "\n":
                    self.said = write_snapshot("".join(lines), self.folder, self._known)
                    self.answered = True
                    lines = []
                    copied()
                else:
                    lines.append(line)
            else:  # the session ended: unfollowed, or by itself (the board went)
                self.answered = self.answered and stop.is_set()
        finally:
            proc.kill()
            proc.wait()

    def unfollow(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()

    def read_once(self, ssh: Ssh, sysfs: str) -> bool:
        """One reading through the host's master connection (the following script ended)."""
        try:
            proc = ssh.open(self.target, "sh", "-c", ONCE, "sh", sysfs, self._pid,
                            timeout=_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError):  # no ssh here, or past the timeout
            return False
        if proc.returncode == 0:
            self.said = write_snapshot(proc.stdout, self.folder, self._known)
        return proc.returncode == 0


class BoardWatch:
    """The figures of ``hosts``, read every ``every_s`` seconds from :meth:`start` to
    :meth:`close` (a :class:`~autodice.backend.session.figures.Boards`)."""

    def __init__(self, ssh: Ssh, hosts: list[Host], every_s: float = EVERY_S):
        self._ssh, self._every_s, self._sysfs = ssh, every_s, sysfs_folder()
        self._folder = Path(tempfile.mkdtemp(prefix="autodice-boards-"))
        self._boards = [BoardCopy(h.target, self._folder / file_slug(h.target.host))
                        for h in hosts]
        self.hosts = [HostFigures(b.target.host, b.files, EnergyMeter(None))
                      for b in self._boards]
        self._frames: Callable[[], int] | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self, frames: Callable[[], int] | None) -> None:
        """Read from now on. ``frames``: results delivered so far, and energy is counted from
        the first (as this machine's); None: a job's own loop, counted from now."""
        self._frames = frames
        for k, board in enumerate(self._boards):
            t = threading.Thread(target=self._watch, args=(k,), daemon=True,
                                 name=f"autodice-board-{board.target.host}")
            t.start()
            self._threads.append(t)

    def _watch(self, k: int) -> None:
        board = self._boards[k]
        while not self._stop.is_set():
            board.follow(self._ssh, self._sysfs, self._every_s, lambda: self._copied(k),
                         self._stop)
            self._stop.wait(self._every_s)  # the board went: follow it again

    def _copied(self, k: int, last: bool = False) -> None:
        """A reading came: the board's sensor looked for in the first, energy sampled."""
        board, figures = self._boards[k], self.hosts[k]
        if not board.found:
            figures.energy = EnergyMeter(find_sensor(board.files), every_s=0.0)
            board.found = True
        n = 0 if self._frames is None else self._frames()
        if self._frames is None or n > 0 or last:
            figures.energy.sample(n)

    def _last(self, k: int) -> None:
        if self._boards[k].answered and self._boards[k].read_once(self._ssh, self._sysfs):
            self._copied(k, last=True)

    def report(self, frames: int | None = None, busy_s: float | None = None
               ) -> dict[str, dict]:
        """Each board's energy as stats.json gives it (``frames``, ``busy_s``: see
        :meth:`~autodice.backend.power.EnergyMeter.report`)."""
        return {h.host: h.energy.report(frames, busy_s) for h in self.hosts}

    def close(self) -> None:
        """Stop following, then one reading more of each board that answered; the copies go,
        the figures stay."""
        self._stop.set()
        for board in self._boards:
            board.unfollow()
        for t in self._threads:
            t.join(timeout=10)
        self._threads = []
        with ThreadPoolExecutor(max_workers=max(1, len(self._boards))) as pool:
            list(pool.map(self._last, range(len(self._boards))))
        shutil.rmtree(self._folder, ignore_errors=True)

    def __enter__(self) -> BoardWatch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
