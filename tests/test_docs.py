"""The documentation stays true: the README is a front door (at most 250 lines) whose quickstart
runs as written, every link in it and in docs/ leads somewhere, and docs/reference.md lists
every command, flag and environment variable as the code has them.

``python tests/test_docs.py`` writes docs/reference.md anew from the CLI (after a flag changes).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
REFERENCE = ROOT / "docs" / "reference.md"

# What each environment variable does; the test below finds every one the code reads.
ENVIRONMENT = {
    "AUTODICE_CACHE": "where the ncnn build, converted models, profiles and job logs are cached "
                      "(default `~/.cache/autodice`)",
    "AUTODICE_NCNN_SDIST": "a copy of ncnn's pinned source package, for a machine without the "
                           "package index (still sha256-checked)",
    "AUTODICE_NCNN_DIR": "an ncnn already installed (the prefix holding "
                         "`lib/cmake/ncnn/ncnnConfig.cmake`): no build",
    "AUTODICE_CLUSTER_DIR": "the default emulated cluster's state directory (default "
                            "`/run/autodice-cluster`; a named cluster's is it with `-NAME`)",
    "AUTODICE_TIMEOUT_S": "seconds a rank waits for a peer before its watchdog names what it "
                          "waits for and the job ends (default 8 on the boards)",
    "AUTODICE_MAP_SLOTS": "`0`: ranks on the gateway's machine receive frames over MPI instead "
                          "of reading the session's shared memory",
    "AUTODICE_WERROR": "`1`: the generated program and the runtime build with warnings as "
                       "errors (the tests set it)",
    "AUTODICE_TORCH_PYTHON": "the Python with torch that `make fidelity` exports models with",
    "AUTODICE_SYSFS": "the sysfs folder power, temperatures and clocks are read from, here and "
                      "on every deployed board (default `/sys`; as node_exporter's "
                      "`--path.sysfs`: a container that sees the host's at `/host/sys`)",
}


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _commands(group: click.Group, prefix: str):
    ctx = click.Context(group)
    for name in sorted(group.list_commands(ctx)):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            yield from _commands(command, f"{prefix} {name}")
        else:
            yield f"{prefix} {name}", command


def reference_text() -> str:
    """docs/reference.md as the CLI and :data:`ENVIRONMENT` make it (byte-stable)."""
    from autodice.cli import main

    lines = ["# Reference: every command, flag and environment variable", "",
             "Made from the CLI itself by `python tests/test_docs.py` (a test holds it to that). "
             "`autodice COMMAND --help` says the same.", ""]
    for path, command in _commands(main, "autodice"):
        args = " ".join(p.name.upper() for p in command.params if isinstance(p, click.Argument))
        rows = []
        for p in command.params:
            if not isinstance(p, click.Option) or p.hidden:
                continue
            flags = ", ".join(f"`{o}`" for o in (*p.opts, *p.secondary_opts))
            default = (f" [default: {p.default}]" if p.show_default and p.default not in
                       (None, False, ()) else "")
            rows.append(f"| {flags} | {_cell((p.help or '') + default)} |")
        lines += [f"## `{path}{' ' + args if args else ''}`", "",
                  _cell((command.help or "").split("\n\n")[0]), "",
                  *(["| flag | what it does |", "|---|---|", *rows] if rows else ["No flags."]),
                  ""]
    lines += ["## Environment variables", "", "| variable | what it does |", "|---|---|"]
    lines += [f"| `{k}` | {_cell(v)} |" for k, v in sorted(ENVIRONMENT.items())]
    return "\n".join(lines) + "\n"


def test_the_reference_lists_every_command_and_flag():
    assert REFERENCE.read_text() == reference_text(), \
        "docs/reference.md is stale: run `python tests/test_docs.py`"


def test_every_environment_variable_the_code_reads_is_documented():
    read = set()
    for path in [*(ROOT / "autodice").rglob("*.py"), *(ROOT / "runtime_cpp").glob("*.cpp"),
                 *(ROOT / "runtime_cpp").glob("*.h"), ROOT / "Makefile"]:
        read |= set(re.findall(r"""(?:environ(?:\.get)?\(?\[?|getenv\()["'](AUTODICE_\w+)""",
                               path.read_text()))
        read |= set(re.findall(r"\b(AUTODICE_\w+)=\$", path.read_text()))
    assert read, "the scan found no environment variable: it is broken"
    assert read <= set(ENVIRONMENT), sorted(read - set(ENVIRONMENT))


def test_the_readme_is_a_front_door_and_every_link_leads_somewhere():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    assert "make demo" in text and "make test" in text and "## Contents" in text
    for doc in [README, *(ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if not re.match(r"[a-z]+:", target):
                assert (doc.parent / target).exists(), f"{doc.name}: {target}"


def runnable_blocks(text: str) -> list[str]:
    """The ```sh blocks the README marks ``<!-- runnable -->`` (the line before), in order."""
    return re.findall(r"<!-- runnable -->\n```sh\n(.*?)```", text, re.S)


@pytest.mark.cpp
def test_the_quickstart_runs_as_written(tmp_path):
    """The quickstart's runnable blocks, in order, in an empty folder, with autodice on PATH as
    its first step puts it there: each command as a user types it."""
    blocks = runnable_blocks(README.read_text())
    assert len(blocks) >= 2
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               AUTODICE_HOME=str(ROOT))
    for block in blocks:
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"{block}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert (tmp_path / "out" / "results" / "stats.json").exists()
    assert "Plotly" in (tmp_path / "report.html").read_text()  # the page, whole


if __name__ == "__main__":
    REFERENCE.write_text(reference_text())
    print(f"wrote {REFERENCE}")
