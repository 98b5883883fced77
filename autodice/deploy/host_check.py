"""Step 1 of deploy, ``connect`` + ``check``: reach every host and check it can build and run.

The check itself opens each host's ssh master connection, or reuses the one an earlier deploy
left open (see :class:`~.ssh.Ssh`), and, in one remote shell, reports the architecture, cores
and CPU features, its C and C++ runtime (:mod:`.abi`), the tools that are missing to run
(rsync, mpirun) and those only a build there needs (compiler, cmake, mpicxx, ncnn: a board
whose program is cross-built here needs none of them; :mod:`.remote_build` decides), and what
an earlier deploy left there (the folders it synced, see :mod:`.sync`; a build stamp, the
binary's checksum, an ncnn it built). Every failing host is reported at once, before anything
is copied anywhere.

Nothing of it is cached here: the one remote shell per host is what a redeploy cannot do
without (it is how deploy learns what the host holds), and the prerequisites add a few forks
to it; measured on the emulated hosts, no difference beside the shell itself.
"""

from __future__ import annotations

from ..core.errors import AutodiceError
from .abi import PROBE
from .ssh import PROGRAM, Build, Host, Progress, Ssh, parallel, why_ssh_failed
from .sync import STAMPS, SYNCED

# Prerequisites, run on each host. Values arrive as "$1"...: never spliced into the script.
# $3 is the remote dir, $4 the folder of the program being deployed (see Build), $5 its name,
# then the folders whose sync stamps to read.
_CHECK = STAMPS + PROBE + r"""
m=$1; n=$2; d=$3; b=$4; e=$5; shift 5
echo "arch=$(uname -m)"
echo "cpus=$(nproc 2>/dev/null || echo 1)"
echo "cpus_all=$(nproc --all 2>/dev/null || echo 1)"
echo "cpu=$(grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null | cut -d: -f2-)"
# "missing=" what running needs, "lacks=" what only a build on the host needs
for t in c++ cmake make; do command -v "$t" >/dev/null 2>&1 || echo "lacks=$t"; done
for t in rsync tar; do command -v "$t" >/dev/null 2>&1 || echo "missing=$t"; done
if [ -n "$m" ]; then
  [ -x "$m/bin/mpirun" ] || echo "missing=mpirun ($m/bin/mpirun)"
  [ -x "$m/bin/mpicxx" ] || echo "lacks=mpicxx ($m/bin/mpicxx)"
else
  command -v mpirun >/dev/null 2>&1 || echo "missing=mpirun (not on PATH; set mpi_prefix)"
  command -v mpicxx >/dev/null 2>&1 || echo "lacks=mpicxx (not on PATH; set mpi_prefix)"
fi
if [ -n "$n" ] && [ ! -f "$n/lib/cmake/ncnn/ncnnConfig.cmake" ]; then
  echo "lacks=ncnn ($n/lib/cmake/ncnn/ncnnConfig.cmake)"
fi
# What an earlier deploy left (read only): lets deploy skip a build or a copy that is done.
stamps "$b" "$@"
[ -f "$b/build/autodice-built" ] && echo "built=$(cat "$b/build/autodice-built")"
[ -x "$b/build/$e" ] && echo "program=$(cksum < "$b/build/$e")"
for f in "$d"/ncnn/*/install/lib/cmake/ncnn/ncnnConfig.cmake; do
  [ -f "$f" ] && k=${f#"$d/ncnn/"} && echo "ncnn_built=${k%%/*}"
done
exit 0
"""


def check_all(ssh: Ssh, hosts: list[Host], progress: Progress, build: Build = PROGRAM) -> None:
    """Connect to every host and check its tools; all failing hosts in one error.

    Also reads what an earlier build of ``build`` left there (stamp, checksum of its binary).
    """
    def check(h: Host) -> None:
        t = h.target
        proc = ssh.open(t, "sh", "-c", _CHECK, "sh", t.mpi_prefix or "", t.ncnn_dir or "", h.dir,
                        build.root(h), build.exe, *SYNCED)
        if proc.returncode == 255:
            raise AutodiceError("connect: " + why_ssh_failed(proc.stderr))
        if proc.returncode != 0:
            raise AutodiceError(f"check: the check script failed: {proc.stderr.strip()[-300:]}")
        missing = []
        for line in proc.stdout.splitlines():
            k, _, v = line.partition("=")
            if k == "missing":
                missing.append(v)
            elif k == "lacks":
                h.lacks += (v,)
            elif k == "ncnn_built":
                h.facts[k] = f"{h.facts.get(k, '')} {v}".strip()
            else:
                h.facts.setdefault(k, v)
        h.arch = h.facts.get("arch", "?")
        h.cpus = int(h.facts.get("cpus") or 1)
        h.cpus_all = int(h.facts.get("cpus_all") or 1)
        h.features = frozenset(h.facts.get("cpu", "").split())
        h.program = h.facts.get("program", "")
        if missing:
            raise AutodiceError("check: missing " + ", ".join(missing))

    problems = parallel(hosts, "", check, progress, label="connect + check")
    if problems:
        raise AutodiceError(*problems)
