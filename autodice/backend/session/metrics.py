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
- ``autodice_incidents_total{kind="lost"|"rebalanced"}``: a recovering session's restarts.

The ranks' own figures (compute, waits, bytes, memory) come with the job's end (stats.json):
the gateway does not yet relay them while a stream runs.
"""

from __future__ import annotations

from collections.abc import Callable

from ...core.errors import AutodiceError
from .figures import LATENCY_BUCKETS, Figures


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

    def __init__(self, address: str, figures: Figures, in_flight: Callable[[], int]):
        """Start serving at ``address``.

        Raises:
            AutodiceError: a bad address, or one that cannot be served (a port in use), in
                one line naming it, before the stream starts.
        """
        from prometheus_client import CollectorRegistry, start_http_server

        host, port = parse_address(address)
        self.registry = CollectorRegistry()
        self.registry.register(_Collector(figures, in_flight))
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

    def __init__(self, figures: Figures, in_flight: Callable[[], int]):
        self.figures, self.in_flight = figures, in_flight

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
