"""A session's figures as Prometheus metrics while frames flow: ``autodice.open(out,
metrics=":9464")``, ``run --metrics :9464``, ``deploy --run --metrics :9464``.

Served by prometheus-client, the Prometheus project's own library: its text format, its
histogram and its HTTP server (a thread, stopped with the session), on a registry of the
session's own so that two sessions in one process do not mix. ``:port`` binds to loopback;
``host:port`` (``0.0.0.0:9464``) where asked.

- ``autodice_frames_total``: results delivered; ``autodice_frames_failed_total``: frames that
  could not be sent (each one's error is in frames.json); ``autodice_frames_dropped_total``: a
  live source's frames the pipeline could not take;
- ``autodice_frames_in_flight``: sent, result not yet read (at most the window);
- ``autodice_frame_latency_seconds``: a histogram of each frame's end-to-end latency;
- ``autodice_incidents_total{kind="lost"|"rebalanced"}``: a recovering session's restarts;
- per rank, labelled ``{rank, host, key, device}``, as the ranks send them to the gateway about
  every second (``LiveFigures``, runtime_cpp/autodice_stats.h) and it relays them with the next
  result: ``autodice_rank_frames_total``, ``autodice_rank_compute_seconds_total``,
  ``autodice_rank_wait_seconds_total{direction="recv"|"send"|"frame"}`` (``frame``: waiting for
  the gateway's word of the next frame, the source's own pace included),
  ``autodice_rank_bytes_total{direction="sent"|"received"}`` and ``autodice_rank_rss_bytes``.
  A restarted job (``--recover``) starts its ranks' counters again from 0, as Prometheus
  expects of a restarted process (``rate()`` takes resets in its stride);
- per host (this machine, and each deployed board as its figures come over ssh about every
  second: :mod:`autodice.deploy.board_figures`), where it has a power sensor
  (:mod:`autodice.backend.power`), labelled ``{host, sensor}``:
  ``autodice_host_energy_joules_total`` since the stream's first result and
  ``autodice_host_power_watts``; no sensor, no such metrics (never a made-up 0);
- per host, where it exposes them (:mod:`autodice.backend.thermal`; here read at each scrape):
  ``autodice_host_temperature_celsius{host, zone}``, ``autodice_host_cpu_clock_hertz{host, cpu}``
  and a Raspberry Pi's ``autodice_host_throttled{host, reason, when="now"|"since_boot"}``.
"""

from __future__ import annotations

from collections.abc import Callable

from ...core.errors import AutodiceError
from ...core.plan import Plan
from ..thermal import host_families
from .figures import LATENCY_BUCKETS, Figures, HostFigures

# What the session gives for the per-rank families: its plan and each rank's latest figures.
Live = Callable[[], tuple[Plan, dict[int, dict[str, float]]]]


def parse_address(text: str) -> tuple[str, int]:
    """``":9464"`` -> ("127.0.0.1", 9464); ``"0.0.0.0:9464"`` -> ("0.0.0.0", 9464).

    Raises:
        AutodiceError: not ``[host]:port`` with a port from 0 to 65535.
    """
    host, sep, port = str(text).rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise AutodiceError(f"--metrics {text}: [HOST]:PORT, e.g. :9464 (loopback) or "
                            "0.0.0.0:9464")
    return host.strip("[]") or "127.0.0.1", int(port)


class Metrics:
    """A session's metrics and their HTTP endpoint (see the module docstring). Read from the
    session's :class:`~.figures.Figures` when scraped: nothing is added to a frame's path."""

    def __init__(self, address: str, figures: Figures, in_flight: Callable[[], int],
                 live: Live | None = None):
        """Start serving at ``address``.

        Raises:
            AutodiceError: a bad address, or one that cannot be served (a port in use), in
                one line naming it, before the stream starts.
        """
        from prometheus_client import CollectorRegistry, start_http_server

        host, port = parse_address(address)
        self.registry = CollectorRegistry()
        self.registry.register(_Collector(figures, in_flight, live))
        try:
            self._server, _ = start_http_server(port, host, registry=self.registry)
        except OSError as e:
            raise AutodiceError(f"--metrics {address}: cannot serve on {host}:{port} "
                                f"({e.strerror or e})") from None
        self.address = f"{host}:{self._server.server_port}"

    def close(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _Collector:
    """The figures as Prometheus metric families, at each scrape."""

    def __init__(self, figures: Figures, in_flight: Callable[[], int], live: Live | None):
        self.figures, self.in_flight, self.live = figures, in_flight, live

    def collect(self):
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        f = self.figures
        yield CounterMetricFamily("autodice_frames", "Frames whose result was delivered.",
                                  value=f.delivered)
        yield CounterMetricFamily("autodice_frames_failed", "Frames that could not be sent.",
                                  value=f.failed)
        yield CounterMetricFamily("autodice_frames_dropped",
                                  "A live source's frames the pipeline could not take.",
                                  value=f.dropped)
        yield GaugeMetricFamily("autodice_frames_in_flight",
                                "Frames sent whose result was not yet read.",
                                value=self.in_flight())
        counts, total = [], 0
        for bound, n in zip((*map(str, LATENCY_BUCKETS), "+Inf"), f.buckets):
            total += n
            counts.append((bound, total))
        yield HistogramMetricFamily("autodice_frame_latency_seconds",
                                    "End-to-end latency of each frame.", buckets=counts,
                                    sum_value=f.latency_sum)
        incidents = CounterMetricFamily("autodice_incidents", "A recovering session's restarts.",
                                        labels=["kind"])
        kinds = [("rebalanced" if "rebalanced" in i else "lost") for i in f.incidents()]
        for kind in ("lost", "rebalanced"):
            incidents.add_metric([kind], kinds.count(kind))
        yield incidents
        hosts = f.hosts()
        yield from _host_energy(hosts)
        yield from host_families([(h.host, h.files) for h in hosts])
        if self.live is not None:
            yield from _rank_families(*self.live())


def _host_energy(hosts: list[HostFigures]):
    """The hosts' energy and power, where each has a sensor (see the module docstring)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    joules = CounterMetricFamily("autodice_host_energy_joules", "A host's energy since the "
                                 "stream's first result.", labels=["host", "sensor"])
    watts = GaugeMetricFamily("autodice_host_power_watts", "A host's power.",
                              labels=["host", "sensor"])
    for h in hosts:
        if h.energy.sensor is None:
            continue
        who = [h.host, h.energy.sensor.name]
        joules.add_metric(who, h.energy.joules)
        if h.energy.watts is not None:
            watts.add_metric(who, h.energy.watts)
    yield from (family for family in (joules, watts) if family.samples)


def _rank_families(plan: Plan, live: dict[int, dict[str, float]]):
    """The ranks' live figures as labelled families (see the module docstring)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    labels = ["rank", "host", "key", "device"]
    frames = CounterMetricFamily("autodice_rank_frames", "Frames this rank computed.",
                                 labels=labels)
    compute = CounterMetricFamily("autodice_rank_compute_seconds",
                                  "Seconds this rank computed.", labels=labels)
    waits = CounterMetricFamily("autodice_rank_wait_seconds", "Seconds this rank waited: to "
                                "receive, to send, for its next frame.", labels=[*labels,
                                                                                 "direction"])
    moved = CounterMetricFamily("autodice_rank_bytes", "Bytes this rank sent and received.",
                                labels=[*labels, "direction"])
    rss = GaugeMetricFamily("autodice_rank_rss_bytes", "This rank's resident memory.",
                            labels=labels)
    for k, f in sorted(live.items()):
        if k >= len(plan.ranks):
            continue  # a restart's plan with fewer ranks: its job's figures come anew
        r = plan.ranks[k]
        who = [str(k), r.host, r.key, r.device]
        frames.add_metric(who, f["frames"])
        compute.add_metric(who, f["compute_s"])
        for direction in ("recv", "send", "frame"):
            waits.add_metric([*who, direction], f[f"{direction}_wait_s"])
        moved.add_metric([*who, "sent"], f["bytes_sent"])
        moved.add_metric([*who, "received"], f["bytes_received"])
        rss.add_metric(who, f["rss"])
    yield from (frames, compute, waits, moved, rss)
