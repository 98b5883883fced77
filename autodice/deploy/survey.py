"""``autodice platform``: the platform file read from the hosts themselves, not guessed by hand.

One ssh shell per host (the inventory's, as deploy reaches them) reports what the host is: its
architecture, the cores it lets us use (its CPU affinity, and a cgroup's CPU quota when that
allows fewer), each core's kind (``/proc/cpuinfo``'s CPU part or model name, cpufreq's maximum),
its memory (and a cgroup's limit), a GPU it names (NVIDIA's driver, a Jetson's device tree),
its glibc and libstdc++ (:data:`.abi.PROBE`), and its kernel's boot id: hosts that share one
kernel (containers, the emulated cluster) share one machine's caches and memory, which the
cost model must know (``machine=``).

The file says where each value came from in comments beside it, and what was assumed where the
host said little. Boards with two kinds of cores (an RK3588's 4 Cortex-A76 + 4 Cortex-A55)
get both named with their cores, and the slower ones as ``little=``: OpenMP waits on its slowest
thread, so a key should hold cores of one kind (``edge01_arm4-7``), and ``split`` and ``layers
--balance`` say so of a key that does not. Vulkan devices are not listed through ncnn here: a Vulkan
driver found without a GPU the host names (Mesa's lavapipe is a CPU) is a comment, not a GPU.
"""

from __future__ import annotations

import math
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import AutodiceError
from ..core.spec import ARCH_SPELLINGS, format_cores, parse_cores
from .abi import PROBE, Runtime
from .inventory import Inventory
from .ssh import Host, Progress, Ssh, parallel, why_ssh_failed

_SURVEY = PROBE + r"""
echo "arch=$(uname -m)"
echo "allowed=$(grep -m1 '^Cpus_allowed_list' /proc/self/status | sed 's/^[^:]*:[[:space:]]*//')"
echo "quota=$(cat /sys/fs/cgroup/cpu.max 2>/dev/null)"
echo "mem=$(grep -m1 '^MemTotal' /proc/meminfo | sed 's/[^0-9]//g')"
echo "mem_limit=$(cat /sys/fs/cgroup/memory.max 2>/dev/null)"
for c in /sys/devices/system/cpu/cpu[0-9]*; do
  f=$(cat "$c/cpufreq/cpuinfo_max_freq" 2>/dev/null) && echo "freq=${c##*/cpu} $f"
done
grep -E '^(processor|CPU part|model name)[[:space:]]*:' /proc/cpuinfo | sed 's/^/cpuinfo=/'
echo "boot_id=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)"
[ -r /proc/device-tree/model ] && echo "model=$(tr -d '\000' < /proc/device-tree/model)"
for f in /proc/driver/nvidia/gpus/*/information; do
  [ -f "$f" ] && echo "nvidia=$(grep -m1 '^Model' "$f" | sed 's/^[^:]*:[[:space:]]*//')"
done
for f in /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json; do
  [ -f "$f" ] && echo "icd=${f##*/}"
done
exit 0
"""
# ARM's CPU part numbers (``/proc/cpuinfo``) of the cores edge boards have: names for comments.
ARM_PARTS = {"0xd03": "Cortex-A53", "0xd04": "Cortex-A35", "0xd05": "Cortex-A55",
             "0xd07": "Cortex-A57", "0xd08": "Cortex-A72", "0xd09": "Cortex-A73",
             "0xd0a": "Cortex-A75", "0xd0b": "Cortex-A76", "0xd0d": "Cortex-A77",
             "0xd41": "Cortex-A78", "0xd42": "Cortex-A78AE", "0xd44": "Cortex-X1",
             "0xd46": "Cortex-A510", "0xd47": "Cortex-A710", "0x004": "Carmel"}


@dataclass
class Survey:
    """What one host said of itself, and the notes on how it was read."""

    host: str
    arch: str = ""
    cores: tuple[int, ...] = ()
    kinds: list[tuple[str, float | None, tuple[int, ...]]] = field(default_factory=list)
    mem: float | None = None  # bytes
    gpu: str | None = None
    runtime: Runtime = field(default_factory=Runtime)
    boot_id: str = ""
    notes: list[str] = field(default_factory=list)


def survey(inv: Inventory, progress: Progress) -> list[Survey]:
    """Ask every host of ``inv`` at once; all hosts that cannot be asked in one error.

    Raises:
        AutodiceError: a host that cannot be reached or whose shell fails, each named.
    """
    hosts = [Host(t) for t in inv.targets.values()]
    found: dict[str, Survey] = {}
    with tempfile.TemporaryDirectory(prefix="autodice-platform-") as work:
        ssh = Ssh(inv, Path(work), keep_s=0)
        try:
            def ask(h: Host) -> None:
                proc = ssh.open(h.target, "sh", "-c", _SURVEY)
                if proc.returncode == 255:
                    raise AutodiceError("connect: " + why_ssh_failed(proc.stderr))
                if proc.returncode != 0:
                    raise AutodiceError(f"the survey script failed: {proc.stderr.strip()[-300:]}")
                found[h.target.host] = read(h.target.host, proc.stdout)

            problems = parallel(hosts, "", ask, progress, label="survey")
        finally:
            ssh.close(inv.targets.values())
    if problems:
        raise AutodiceError(*problems)
    return [found[h.target.host] for h in hosts]


def read(host: str, said: str) -> Survey:
    """A host's survey from what its shell printed (``key=value`` lines)."""
    facts: dict[str, list[str]] = {}
    for line in said.splitlines():
        k, eq, v = line.partition("=")
        if eq:
            facts.setdefault(k, []).append(v.strip())

    def one(key: str) -> str:
        return (facts.get(key) or [""])[0]

    s = Survey(host, arch=one("arch"), runtime=Runtime.of({k: one(k) for k in
                                                           ("glibc", "libstdcxx")}),
               boot_id=one("boot_id"))
    s.cores = _cores(one("allowed"), one("quota"), s.notes)
    s.kinds = _kinds(s.cores, facts.get("cpuinfo", []), facts.get("freq", []), s.notes)
    s.mem = _memory(one("mem"), one("mem_limit"), s.notes)
    s.gpu = _gpu(one("nvidia"), one("model"), facts.get("icd", []), s.notes)
    return s


def _cores(allowed: str, quota: str, notes: list[str]) -> tuple[int, ...]:
    try:
        cores = parse_cores(allowed)
    except ValueError:
        notes.append("its CPU affinity was unreadable: assumed core 0 only")
        return (0,)
    words = quota.split()
    if len(words) == 2 and words[0].isdigit() and words[1].isdigit():
        usable = max(1, int(words[0]) // int(words[1]))
        if usable < len(cores):
            notes.append(f"its cgroup's CPU quota ({quota}) allows {usable} of the "
                         f"{len(cores)} cores it may run on: slots are the first {usable}")
            cores = cores[:usable]
    return cores


def _kinds(cores: tuple[int, ...], cpuinfo: list[str], freqs: list[str],
           notes: list[str]) -> list[tuple[str, float | None, tuple[int, ...]]]:
    """Groups of ``cores`` of one kind (name, max GHz), fastest first."""
    name_of: dict[int, str] = {}
    current = None
    for line in cpuinfo:
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "processor" and value.isdigit():
            current = int(value)
        elif current is not None and key in ("CPU part", "model name"):
            name_of[current] = ARM_PARTS.get(value.lower(), value) if key == "CPU part" else value
    ghz: dict[int, float] = {}
    for line in freqs:
        cpu, _, khz = line.partition(" ")
        if cpu.isdigit() and khz.isdigit():
            ghz[int(cpu)] = int(khz) / 1e6
    if not ghz:
        notes.append("no cpufreq: the cores' speeds are not known here (all taken as equal)")
    groups: dict[tuple[str, float | None], list[int]] = {}
    for c in cores:
        groups.setdefault((name_of.get(c, "?"), ghz.get(c)), []).append(c)
    return sorted(((n, f, tuple(cs)) for (n, f), cs in groups.items()),
                  key=lambda k: -(k[1] or 0))


def _memory(mem_kb: str, limit: str, notes: list[str]) -> float | None:
    if not mem_kb.isdigit():
        notes.append("no MemTotal in /proc/meminfo: mem left out")
        return None
    mem = int(mem_kb) * 1024.0
    if limit.isdigit() and int(limit) < mem:
        notes.append(f"its cgroup's memory limit ({int(limit) / 2**30:.1f} GiB) is below the "
                     f"machine's ({mem / 2**30:.1f} GiB): mem is the limit")
        mem = float(limit)
    return mem


def _gpu(nvidia: str, model: str, icds: list[str], notes: list[str]) -> str | None:
    if nvidia:
        return f"{_word(nvidia)} (VULKAN)"
    if "jetson" in model.lower():
        return f"{_word(model)} (VULKAN)"
    if icds:
        notes.append(f"Vulkan drivers {', '.join(icds)} but no GPU named by the host (Mesa's "
                     "lavapipe, lvp, is a CPU): no gpu written")
    return None


def _little(kinds: list[tuple[str, float | None, tuple[int, ...]]]) -> tuple[int, ...]:
    """The cores of every kind slower than the fastest (by cpufreq's maximum), sorted; none
    when there is one kind or a speed is not known."""
    if len(kinds) < 2 or any(ghz is None for _, ghz, _ in kinds):
        return ()
    fastest = max(ghz for _, ghz, _ in kinds)
    return tuple(sorted(c for _, ghz, cores in kinds if ghz < fastest for c in cores))


def _word(text: str) -> str:
    """A name from a host made safe for a platform-file field (no , # = ( ) or line breaks)."""
    return re.sub(r"\s+", " ", re.sub(r"[,#=()\n\r]", " ", text)).strip() or "?"


def platform_text(surveys: list[Survey]) -> str:
    """platform.txt for the surveyed hosts, each line after comments saying where it came
    from."""
    first_on: dict[str, str] = {}
    for s in surveys:
        if s.boot_id:
            first_on.setdefault(s.boot_id, s.host)
    shared = {b for b in first_on if sum(s.boot_id == b for s in surveys) > 1}
    lines = ["# Written by `autodice platform` from what each host said of itself over ssh."]
    for s in surveys:
        arch = ARCH_SPELLINGS.get(s.arch, "cpu")
        lines.append(f"# {s.host}: uname -m {s.arch or '?'}; {s.runtime.words()}; "
                     f"cores {format_cores(s.cores)} (CPU affinity)")
        for name, ghz, cores in s.kinds:
            if name != "?" or ghz:
                speed = f", {ghz:.2f} GHz max" if ghz else ""
                lines.append(f"#   cores {format_cores(cores)}: {name}{speed}")
        little = _little(s.kinds)
        if len(s.kinds) > 1:
            lines.append("#   two kinds of cores: give a key cores of one kind (OpenMP waits on "
                         "its slowest thread)" + ("" if little else "; their speeds are not "
                                                  "known here, so little= is left out"))
        lines += [f"#   note: {n}" for n in s.notes]
        fields = [s.host, arch, f"slots={format_cores(s.cores)}"]
        if s.mem:  # rounded down: a memory cap must not promise more than there is
            fields.append(f"mem={math.floor(s.mem / 2**30 * 10) / 10:g}GiB" if s.mem >= 2**30
                          else f"mem={max(1, math.floor(s.mem / 2**20))}MiB")
        if s.gpu:
            fields.append(f"gpu={s.gpu}")
        if s.boot_id in shared:
            fields.append(f"machine={first_on[s.boot_id]}")
        if little:
            fields.append(f"little={format_cores(little)}")
        lines.append(", ".join(fields))
    if shared:
        lines.append("# machine=: these hosts share one kernel (its boot id), so one machine's "
                     "memory and caches")
    return "\n".join(lines) + "\n"


def write_platform(inventory: str | Path, output: str | Path,
                   progress: Progress = lambda host, step: None) -> str:
    """Survey the inventory's hosts and write ``output`` (whole, or not at all); returns its
    text, which is read as every command reads a platform file before it is written.

    Raises:
        AutodiceError: a bad inventory, a host that cannot be asked (all named), or an
            ``output`` that cannot be written.
    """
    from ..core.outdir import write_atomic
    from ..core.spec import parse_platform_text
    from .inventory import load_inventory

    inv = load_inventory(inventory)
    output = Path(output)
    if not output.parent.is_dir():
        raise AutodiceError(f"{output}: its folder {output.parent} does not exist")
    surveys = survey(inv, progress)
    text = platform_text(surveys)
    parse_platform_text(text, str(output))
    try:
        write_atomic(output, text.encode())
    except OSError as e:
        raise AutodiceError(f"{output}: cannot write it ({e.strerror})") from None
    return text
