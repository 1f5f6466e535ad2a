"""Prometheus metrics: request counts and latencies observed by the API, stage gauges read from the
kernel at scrape time. Each app owns its registry, so several servers can live in one process.
"""

from __future__ import annotations

import re
import time

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_RTF_BUCKETS = (0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0, 8.0)
_TPS_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500)


_SKIP = {"time"}  # stage fields that are not measurements


class _StageClocks:
    """Each replica's clocks (`time_s`: seconds per part of its timeline, omni/lane_clock.py) as
    counters that never go down. A restarted replica's process counts from zero again (it is seen
    by a new PID, or by a clock that went back), so what the previous process had counted is
    carried: the seconds it ran after its last report before it died are all that is lost."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[int, dict[str, float]]] = {}  # stage -> (last PID seen up, last clocks)
        self._carried: dict[str, dict[str, float]] = {}

    def totals(self, stage: str, pid: int, parts: dict[str, float]) -> dict[str, float]:
        last_pid, last = self._last.get(stage, (0, {}))
        carried = self._carried.setdefault(stage, {})
        restarted = bool(pid and last_pid and pid != last_pid)
        for part, value in last.items():
            if restarted or parts.get(part, value) < value:
                carried[part] = carried.get(part, 0.0) + value
        self._last[stage] = (pid or last_pid, dict(parts))
        return {part: carried.get(part, 0.0) + parts.get(part, 0.0) for part in {*carried, *parts}}


class _StageCollector:
    """Turns the last `kernel.stats()` snapshot into metrics per stage: fields named `*_total` are
    counters (the kernel keeps them monotone), the rest gauges; the clocks (`time_s`) are the counter
    `omni_stage_time_seconds_total{stage, part}`. A replica that is not up reports pid 0, which is
    left out: a down stage shows no PID."""

    def __init__(self) -> None:
        self.snapshot: dict[str, dict] = {}
        self.clocks = _StageClocks()

    def collect(self):
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        time_s = CounterMetricFamily("omni_stage_time_seconds", "seconds of each replica's timeline by part: "
                                     "its loop's lanes (they add up to its wall time), step, recv, gpu",
                                     labels=["stage", "part"])
        for stage, fields in sorted(self.snapshot.items()):
            if isinstance((fields or {}).get("time_s"), dict):
                totals = self.clocks.totals(stage, int(fields.get("pid") or 0), fields["time_s"])
                for part, seconds in sorted(totals.items()):
                    time_s.add_metric([stage, part], seconds)
            for key, value in sorted((fields or {}).items()):
                if isinstance(value, bool) or not isinstance(value, (int, float)) or key in _SKIP:
                    continue
                if key == "pid" and not value:
                    continue
                name = "omni_stage_" + re.sub(r"[^a-zA-Z0-9_]", "_", key).strip("_").lower()
                if name not in families:
                    if name.endswith("_total"):
                        families[name] = CounterMetricFamily(name.removesuffix("_total"),
                                                             f"stage {key} (from the kernel)", labels=["stage"])
                    else:
                        families[name] = GaugeMetricFamily(name, f"stage {key} (from the kernel)",
                                                           labels=["stage"])
                families[name].add_metric([stage], float(value))
        yield from families.values()
        if time_s.samples:
            yield time_s


class _BudgetCollector:
    """Each memory budget's limit, bytes held now, peak and refused requests, by resource."""

    def __init__(self, budgets) -> None:
        self.budgets = budgets

    def collect(self):
        fields = (("omni_memory_budget_limit_bytes", "total bytes allowed", "limit"),
                  ("omni_memory_budget_used_bytes", "bytes held now by every client together", "used"),
                  ("omni_memory_budget_peak_bytes", "most bytes held at once", "peak"))
        for name, doc, attr in fields:
            family = GaugeMetricFamily(name, f"memory budget: {doc}", labels=["resource"])
            for budget in self.budgets:
                family.add_metric([budget.resource], float(getattr(budget, attr)))
            yield family
        refusals = CounterMetricFamily("omni_memory_budget_refusals", "memory budget: requests refused for it",
                                       labels=["resource"])
        for budget in self.budgets:
            refusals.add_metric([budget.resource], float(budget.refusals))
        yield refusals


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("omni_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=self.registry)
        self.ttft = Histogram("omni_time_to_first_token_seconds", "submit to first text token",
                              ["route"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.ttfa = Histogram("omni_time_to_first_audio_seconds", "submit to first audio samples",
                              ["route"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.rtf = Histogram("omni_real_time_factor", "generation wall time / audio duration",
                             ["route"], buckets=_RTF_BUCKETS, registry=self.registry)
        self.tokens_per_s = Histogram("omni_tokens_per_second", "completion tokens / decode time per request",
                                      ["route"], buckets=_TPS_BUCKETS, registry=self.registry)
        self.stages = _StageCollector()
        self.registry.register(self.stages)

    def watch_budgets(self, budgets) -> None:
        """Report the server's memory budgets (budgets.py) at every scrape."""
        self.registry.register(_BudgetCollector(budgets))

    def render(self, stage_stats: dict[str, dict]) -> bytes:
        self.stages.snapshot = stage_stats
        return generate_latest(self.registry)


class RequestTimer:
    """Times one generation and reports TTFT / time to first audio / RTF / tokens per second."""

    def __init__(self, metrics: ApiMetrics, route: str) -> None:
        self.metrics, self.route = metrics, route
        self.start = time.perf_counter()
        self.first_text: float | None = None
        self.first_audio: float | None = None
        self.audio_seconds = 0.0

    def on_text(self) -> None:
        if self.first_text is None:
            self.first_text = time.perf_counter()
            self.metrics.ttft.labels(self.route).observe(self.first_text - self.start)

    def on_audio(self, samples: int, sample_rate: int) -> None:
        if self.first_audio is None:
            self.first_audio = time.perf_counter()
            self.metrics.ttfa.labels(self.route).observe(self.first_audio - self.start)
        self.audio_seconds += samples / max(sample_rate, 1)

    def finish(self, completion_tokens: int) -> None:
        end = time.perf_counter()
        if self.audio_seconds > 0:
            self.metrics.rtf.labels(self.route).observe((end - self.start) / self.audio_seconds)
        if completion_tokens > 0 and self.first_text is not None and end > self.first_text:
            self.metrics.tokens_per_s.labels(self.route).observe(completion_tokens / (end - self.first_text))


def route_label(request: web.Request) -> str:
    """The route's template (never the raw path, which would blow up label cardinality)."""
    route = request.match_info.route
    resource = getattr(route, "resource", None)
    if resource is None:
        return "unmatched"
    return resource.canonical
