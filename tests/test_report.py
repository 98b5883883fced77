"""The page (``autodice view OUT -o report.html``, a search's ``report.html``) in a real browser.

Debian's chromium, headless, opens the page from disk behind a proxy that does not exist, so the
page must draw with no network; the tests read the DOM it rendered (Plotly's SVG included) and
keep screenshots in build/screenshots/.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from graphs import figure2
from test_cost import fixture_profile
from test_dse import PLATFORM

from autodice.cli import main
from autodice.core.model import load_model
from autodice.core.plan import load_plan
from autodice.dse.profile import save_profile
from autodice.frontend.split import plan_graph
from autodice.report.page import html_json
from autodice.report.partition import partition_view

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None,
                                reason="no chromium (make test installs it from Debian as root)")
SHOTS = Path(__file__).resolve().parent.parent / "build" / "screenshots"
SPECS = Path(__file__).resolve().parent.parent / "specs"
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}


class Dom(HTMLParser):
    """The rendered DOM as elements (tag, attributes, the ids of the elements around it) and
    the text under each id."""

    def __init__(self, text: str):
        super().__init__()
        self.elements: list[tuple[str, dict, tuple[str, ...]]] = []
        self.text: dict[str, str] = {}
        self._open: list[str | None] = []
        self.title = ""
        self.feed(text)

    def _ids(self) -> tuple[str, ...]:
        return tuple(i for i in self._open if i)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.elements.append((tag, attrs, self._ids()))
        if tag not in VOID:
            self._open.append(attrs.get("id"))

    def handle_startendtag(self, tag, attrs):
        self.elements.append((tag, dict(attrs), self._ids()))

    def handle_endtag(self, tag):
        if tag not in VOID and self._open:
            self._open.pop()

    def handle_data(self, data):
        if self.elements and self.elements[-1][0] == "title":
            self.title += data
        for i in self._ids():
            self.text[i] = self.text.get(i, "") + data

    def within(self, id_: str, tag: str, cls: str | None = None) -> list[dict]:
        return [a for t, a, ids in self.elements if t == tag and id_ in ids
                and (cls is None or cls in (a.get("class") or "").split())]

    def body(self) -> dict:
        return next(a for t, a, _ in self.elements if t == "body")


def chromium(page: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={tmp / 'chromium'}", "--proxy-server=127.0.0.1:9",
         "--virtual-time-budget=20000", *args, page.as_uri() if "#" not in str(page)
         else "file://" + str(page)], capture_output=True, text=True, timeout=120)


def browse(page: Path, tmp: Path) -> Dom:
    proc = chromium(page, tmp, "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = Dom(proc.stdout)
    assert dom.body().get("data-rendered") == "true", "the page did not finish drawing"
    return dom


def shoot(page: Path, tmp: Path, name: str) -> Path:
    """A screenshot kept in build/screenshots/, checked to be a drawing, not a blank page."""
    from PIL import Image

    SHOTS.mkdir(parents=True, exist_ok=True)
    png = SHOTS / f"{name}.png"
    proc = chromium(page, tmp, "--hide-scrollbars", "--window-size=1400,1400",
                    f"--screenshot={png}")
    assert proc.returncode == 0 and png.is_file(), proc.stderr[-2000:]
    pixels = np.asarray(Image.open(png).convert("L"), dtype=np.float32)
    assert pixels.shape == (1400, 1400) and pixels.std() > 10
    return png


def test_the_page_of_a_run_draws_the_partition_the_keys_and_the_ranks(fig2_built, tmp_path):
    out = fig2_built / "out"
    np.save(tmp_path / "batch.npy",
            np.random.default_rng(1).standard_normal((8, 4, 8, 8)).astype(np.float32))
    proc = subprocess.run([sys.executable, "-m", "autodice", "run", str(out), "--input",
                           str(tmp_path / "batch.npy"), "--results", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    save_profile(fixture_profile(load_model(fig2_built / "model.onnx")), tmp_path / "prof.json")
    page = tmp_path / "report.html"
    r = CliRunner().invoke(main, ["view", str(out), "-o", str(page), "--stats",
                                  str(tmp_path / "r" / "stats.json"), "--profile",
                                  str(tmp_path / "prof.json")])
    assert r.exit_code == 0, r.output
    assert page.stat().st_size < 5e6 and oct(page.stat().st_mode & 0o777) == oct(0o666 & ~umask())

    dom = browse(page, tmp_path)
    plan = load_plan(out)
    drawn = partition_view(plan, plan_graph(out, plan))
    # every layer (this model is small: one node each) and every cut tensor's mark, as SVG
    assert len(drawn["nodes"]) == sum(len(r.layers) for r in plan.ranks if r.turns()[0] == r.rank)
    assert len(dom.within("partition", "path", "point")) == len(drawn["nodes"]) + \
        len(drawn["cuts"]) > len(plan.ranks)
    rows = dom.within("keys", "tr")
    assert len(rows) == 1 + len(plan.ranks)
    assert len(dom.within("keys", "td")) == 14 * len(plan.ranks)
    assert "compute ms" in dom.text["keys"]  # predicted by the profile
    assert all(r.key in dom.text["keys"] and f"rank {r.rank}: {r.key}" in dom.text["run-ranks"]
               for r in plan.ranks)  # the copy rank has a bar of its own
    assert "8 frames" in dom.text["run-summary"] and "latency p50" in dom.text["run-summary"]
    stats = json.loads((tmp_path / "r" / "stats.json").read_text())
    assert sum(stats["latency_histogram"]["counts"]) == 8
    assert dom.within("run-latency", "g", "point")  # the histogram's bars
    shoot(page, tmp_path, "report-run")


def test_a_search_page_shows_and_saves_the_mapping_of_a_point(zoo_model, tmp_path):
    (tmp_path / "platform.txt").write_text(PLATFORM)
    model = zoo_model("squeezenet")
    save_profile(fixture_profile(load_model(model)), tmp_path / "profile.json")
    r = CliRunner().invoke(main, ["dse", str(model), "-p", str(tmp_path / "platform.txt"),
                                  "--profile", str(tmp_path / "profile.json"), "-o",
                                  str(tmp_path / "front"), "--pop", "16", "--gens", "8"])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "front" / "pareto.json").read_text())
    assert len(doc["points"]) >= 2
    last = doc["points"][-1]
    dom = browse(Path(f"{tmp_path / 'front' / 'report.html'}#point={last['point']}"), tmp_path)
    assert len(dom.within("front", "path", "point")) == \
        len(doc["points"]) + len(doc["references"]) + 1  # + the ring on the chosen point
    want = (tmp_path / "front" / last["mapping"]).read_text()
    assert dom.body()["data-point"] == last["point"]
    assert dom.text["point-mapping"] == want  # the mapping file, as dse wrote it
    save = dom.within("point-panel", "a")[0]
    assert save["download"] == f"{last['point']}.json"
    assert unquote(save["href"].split(",", 1)[1]) == want
    assert all(key in dom.text["point-ranks"] for key in json.loads(want))
    shoot(Path(f"{tmp_path / 'front' / 'report.html'}#point={last['point']}"), tmp_path,
          "report-search")


def test_names_stay_text_and_a_split_with_no_run_says_so(tmp_path):
    """A layer named to end the page's script and start another is drawn as a name; an
    output with no results/stats.json yet gets the partition and a line saying so."""
    hostile = 'Conv1</script><script>document.title="pwned"</script><!--'
    model = figure2()
    next(n for n in model.graph.node if n.name == "Conv1").name = hostile
    onnx.save(model, tmp_path / "model.onnx")
    mapping = json.loads((SPECS / "figure2" / "mapping.json").read_text())
    mapping["edge04_gpu"] = [hostile, "Relu1"]
    (tmp_path / "mapping.json").write_text(json.dumps(mapping))
    shutil.copy(SPECS / "figure2" / "platform.txt", tmp_path / "platform.txt")
    r = CliRunner().invoke(main, ["split", str(tmp_path / "model.onnx"), "-m",
                                  str(tmp_path / "mapping.json"), "-p",
                                  str(tmp_path / "platform.txt"), "-o", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    page = tmp_path / "report.html"
    r = CliRunner().invoke(main, ["view", str(tmp_path / "out"), "-o", str(page)])
    assert r.exit_code == 0, r.output
    dom = browse(page, tmp_path)
    assert len([t for t, _, _ in dom.elements if t == "script"]) == 3
    assert dom.text.get("no-run", "").startswith("No run yet")
    assert dom.title.strip() == "model.onnx over 3 ranks"  # the hostile name's script never ran
    assert len(dom.within("partition", "path", "point")) >= 5


def test_html_json_cannot_end_a_script_element():
    data = {"name": "</script><!-- & -->", "n": [1, 2.5]}
    text = html_json(data)
    assert not {"<", ">", "&"} & set(text) and json.loads(text) == data


@pytest.mark.parametrize("args, message", [
    (["-o", "{tmp}/page.htm", "--profile", "nope.json"], "nope.json"),
    (["-o", "{tmp}/picture.png", "--stats", "{tmp}/stats.json"], "are for a page"),
])
def test_bad_view_options_exit_2(fig2, tmp_path, args, message):
    (tmp_path / "stats.json").write_text("{}")
    r = CliRunner().invoke(main, ["split", str(fig2 / "model.onnx"), "-m",
                                  str(fig2 / "mapping.json"), "-p", str(fig2 / "platform.txt"),
                                  "-o", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["view", str(tmp_path / "out"),
                                  *[a.format(tmp=tmp_path) for a in args]])
    assert r.exit_code == 2 and message in r.output
    assert not (tmp_path / "page.htm").exists() and not (tmp_path / "picture.png").exists()


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
