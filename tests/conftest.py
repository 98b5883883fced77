import os
import shutil
import sys
import tempfile
from pathlib import Path

import onnx
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from graphs import figure2  # noqa: E402

from autodice.frontend import zoo  # noqa: E402

SPECS = Path(__file__).parent.parent / "specs"
# The tests' own emulated cluster: a name and subnet of their own, so `make test` never
# replaces or takes down a cluster a user brought up (the default one, or any other).
TEST_CLUSTER = {"name": "autodice-tests", "subnet": "10.79.0.0/24"}


def board_missing() -> str:
    """Why an emulated aarch64 board cannot be brought up here ("" when it can)."""
    import os

    from autodice.deploy.emulated.arm_board import QEMU

    if os.geteuid() != 0:
        return "the emulated cluster needs root; CI runs these as root"
    lacking = [p for p, ok in (("qemu-user-static", QEMU.exists()),
                               ("g++-aarch64-linux-gnu", shutil.which("aarch64-linux-gnu-g++")),
                               ("apt", shutil.which("apt-get"))) if not ok]
    if lacking:
        return f"an emulated aarch64 board needs {', '.join(lacking)} (`make test` installs them)"
    return ""


def netns(host: str) -> str:
    """The network namespace of ``host`` in the tests' cluster."""
    from autodice.deploy.emulated.state import load_state

    return next(h.netns for h in load_state(TEST_CLUSTER["name"]).hosts if h.name == host)


def vulkan_available() -> bool:
    """A Vulkan driver (on CI: Mesa's lavapipe, which `make test` installs; on a GPU machine the
    one VK_ICD_FILENAMES or VK_DRIVER_FILES names). ncnn loads the driver itself: no loader
    library is needed (a GPU machine of this project has none)."""
    import glob
    import os

    named = [f for v in ("VK_ICD_FILENAMES", "VK_DRIVER_FILES")
             for f in os.environ.get(v, "").split(os.pathsep) if f]
    drivers = [*glob.glob("/usr/share/vulkan/icd.d/*.json"), *glob.glob("/etc/vulkan/icd.d/*.json"),
               *named]
    return any(os.path.isfile(f) for f in drivers)


requires_vulkan = pytest.mark.skipif(
    not vulkan_available(),
    reason="no Vulkan driver (as root, `make test` installs Mesa's lavapipe)")


# `make test` runs the suite on three pytest-xdist workers, then the tests marked `alone` one at
# a time with nothing beside them: those timed against the wall clock, and every test of the
# modules that bring up the tests' emulated cluster (TEST_CLUSTER). Its hosts' Open MPI daemons
# and jobs share this machine's /tmp, /dev/shm and two cores with whatever runs beside them:
# in a clean-clone run beside another worker two of them failed (a remote daemon that exited
# 213 at its start, a lost head reported as another rank's abort).
ALONE_MODULES = {"test_arm", "test_boards_as_they_come", "test_cluster", "test_links"}
# On the workers, these run on one of them, one after another, as in a run of one: the tests
# that check /dev/shm as a whole, and the cluster's modules where a run takes them to the
# workers (`pytest -n 2` without `-m "not alone"`). Every other test is a unit of its own.
SERIAL_MODULES = {"test_faults", "test_runtime_cpp"}
SERIAL_TESTS = {"test_a_dead_or_hung_rank_ends_the_job_within_10_s_naming_it"}


@pytest.hookimpl(tryfirst=True)  # marked before `-m` deselects by the marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.stem in ALONE_MODULES:
            item.add_marker(pytest.mark.alone)


@pytest.hookimpl(optionalhook=True)  # a run without pytest-xdist has no such hook
def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduling with our scopes. Not ``--dist loadgroup``: xdist 3.8 marks a
    group by rewriting ``item._nodeid``, which pytest 9 no longer reads, so the groups split."""
    from xdist.scheduler import LoadScopeScheduling

    class Serial(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
            test = nodeid.rsplit("::", 1)[-1].split("[", 1)[0]
            serial = module in SERIAL_MODULES | ALONE_MODULES or test in SERIAL_TESTS
            return "serial" if serial else nodeid

    return Serial(config, log)


def shm_entries() -> set[Path]:
    """/dev/shm's entries, less the job folders (``autodice-job-PID-*``) of processes alive
    that are neither this one nor its children: the other worker's jobs, running beside."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        return set()
    return {p for p in shm.iterdir() if not _foreign_job(p.name)}


def _foreign_job(name: str) -> bool:
    parts = name.split("-")
    if not name.startswith("autodice-job-") or len(parts) < 4 or not parts[2].isdigit():
        return False
    pid = int(parts[2])
    while pid > 1:
        if pid == os.getpid():
            return False
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False  # gone: a job's leftover, ours to see
    return True


@pytest.fixture(scope="session", autouse=True)
def _run_environment(tmp_path_factory):
    """Every temporary folder autodice makes, here and in the processes the tests start, goes
    under one short folder of the run's, removed at its end: a session whose job failed keeps
    its folder (its log is named in the error), and the tests that make jobs fail on purpose
    left dozens in /tmp a run. One folder: a test closes the ssh masters a deploy it started
    opened. Short: a socket path has 108 bytes. And every C++ build treats warnings as errors
    (a user's does not: see templates/CMakeLists.txt.j2)."""
    tmp_path_factory.getbasetemp()  # pytest's own stays where it was, beside the runs before
    mine = tempfile.mkdtemp(prefix="adt-")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tempfile, "tempdir", mine)
        mp.setenv("TMPDIR", mine)
        mp.setenv("AUTODICE_WERROR", "1")  # every build here: a warning fails the test
        yield
    shutil.rmtree(mine, ignore_errors=True)


@pytest.fixture
def fig2(tmp_path):
    """The Figure 2 model, mapping and platform, copied into a fresh directory."""
    for f in ("mapping.json", "platform.txt"):
        shutil.copy(SPECS / "figure2" / f, tmp_path / f)
    onnx.save(figure2(), tmp_path / "model.onnx")
    return tmp_path


@pytest.fixture(scope="session")
def zoo_model(tmp_path_factory):
    """zoo_model("resnet50") -> path of the full-size model with seeded weights (made once)."""
    cache = tmp_path_factory.mktemp("zoo")

    def get(name: str) -> Path:
        path = cache / f"{name}.onnx"
        if not path.exists():
            zoo.save(zoo.materialize(name, seed=0), path)
        return path

    return get


@pytest.fixture(scope="session")
def fig2_built(tmp_path_factory):
    """Figure 2 with all three kinds of parallelism (specs/figure2/three-kinds.json) split, gen'd
    and built once for the run: ``fig2_built / "out"``. Tests read it and write only results
    folders of their own."""
    import autodice

    d = tmp_path_factory.mktemp("fig2_built")
    shutil.copy(SPECS / "figure2" / "platform.txt", d / "platform.txt")
    shutil.copy(SPECS / "figure2" / "three-kinds.json", d / "mapping.json")
    onnx.save(figure2(), d / "model.onnx")
    autodice.split(d / "model.onnx", d / "mapping.json", d / "platform.txt", d / "out")
    autodice.gen(d / "out")
    autodice.build(d / "out")
    return d
