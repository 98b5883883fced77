"""Prometheus metrics while a stream runs (autodice/backend/session/metrics.py): scraped over
HTTP mid-stream and parsed with prometheus-client's own parser, gone once the session closes;
an address that cannot be served is one line before the stream starts."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

import autodice
from autodice.core.errors import AutodiceError

pytestmark = pytest.mark.cpp


def scrape(address: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    return {s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_running_session_is_scraped_while_frames_flow(fig2_built):
    xs = np.random.default_rng(3).standard_normal((60, 1, 4, 8, 8)).astype(np.float32)
    port = free_port()
    seen = {}
    with autodice.open(fig2_built / "out", metrics=f":{port}") as s:
        address = f"127.0.0.1:{port}"
        frames = [*xs[:30], np.zeros((2, 2), np.float32), *xs[30:]]  # one that cannot be sent
        for i, _ in enumerate(s.map(frames)):
            if i == 40:
                seen = scrape(address)
    assert 30 <= seen["autodice_frames_total"] <= 41
    assert seen["autodice_frames_failed_total"] == 1
    assert 0 <= seen["autodice_frames_in_flight"] <= s.window
    assert seen["autodice_frame_latency_seconds_count"] == seen["autodice_frames_total"]
    assert seen['autodice_frame_latency_seconds_bucket{le=+Inf}'] == seen["autodice_frames_total"]
    assert 0 < seen["autodice_frame_latency_seconds_sum"] < 60
    assert seen["autodice_incidents_total{kind=lost}"] == 0
    with pytest.raises(urllib.error.URLError):  # the endpoint ends with the session
        scrape(address)


def test_the_ranks_own_figures_grow_between_two_scrapes(fig2_built):
    """Ranks send their figures about every second while frames flow: two scrapes 1.5 s apart
    both name every rank, and what each rank counts has grown in between."""
    xs = np.random.default_rng(4).standard_normal((1, 4, 8, 8)).astype(np.float32)
    port = free_port()
    scrapes = []

    def paced():  # a camera's pace: 50 frames/s for about 4 s
        for _ in range(200):
            time.sleep(0.02)
            yield xs

    with autodice.open(fig2_built / "out", metrics=f":{port}") as s:
        plan = s.plan
        for i, _ in enumerate(s.map(paced())):
            if i in (75, 150):
                scrapes.append(scrape(f"127.0.0.1:{port}"))
    first, second = scrapes
    assert first["autodice_frames_total"] < second["autodice_frames_total"]
    for r in plan.ranks:
        def of(scraped, name, **more):
            labels = {"rank": r.rank, "host": r.host, "key": r.key, "device": r.device, **more}
            return scraped[name + "".join(f"{{{k}={v}}}" for k, v in sorted(labels.items()))]

        took = of(second, "autodice_rank_frames_total")
        assert 0 < of(first, "autodice_rank_frames_total") < took <= 151
        assert of(first, "autodice_rank_compute_seconds_total") < \
            of(second, "autodice_rank_compute_seconds_total")
        assert of(second, "autodice_rank_rss_bytes") > 1e6
        assert of(second, "autodice_rank_wait_seconds_total", direction="frame") > 0
        assert of(second, "autodice_rank_bytes_total", direction="sent") == \
            sum(e.nbytes * len(e.dst) for e in r.send) * took


def test_an_address_that_cannot_be_served_is_one_line(fig2_built):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(AutodiceError, match=f"--metrics :{port}: cannot serve on "
                                                f"127.0.0.1:{port}"):
            autodice.open(fig2_built / "out", metrics=f":{port}")
    with pytest.raises(AutodiceError, match="--metrics 9464: \\[HOST\\]:PORT"):
        autodice.open(fig2_built / "out", metrics="9464")
