"""/metrics follows Prometheus' rules across a stage's deaths: the restart counter never goes down,
not even when the restart budget's window empties at a cool-down; a stage that is down shows no
PID; cool-downs are counted."""

from __future__ import annotations

import re

import requests

from test_api_faults import wait_for
from test_api_support import LiveServer


def _sample(metrics: str, name: str, stage: str = "vocoder.0") -> float | None:
    found = re.search(rf'^{name}{{stage="{re.escape(stage)}"}} (\S+)$', metrics, re.M)
    return float(found.group(1)) if found else None


def test_restart_counter_is_monotone_across_a_cool_down_and_a_down_stage_has_no_pid():
    changes = {"vocoder": {"max_restarts": 1, "restart_cooldown_s": 1.5}}
    with LiveServer(mode="process", spec_changes=changes) as srv:
        scrape = lambda: requests.get(srv.url + "/metrics", timeout=10).text  # noqa: E731
        seen, down_pids = [], []
        for _ in range(3):  # past the first death each is over the budget: a cool-down, the window afresh
            wait_for(lambda: srv.kernel.health()["vocoder"] == "up", timeout=30)
            seen.append(_sample(scrape(), "omni_stage_restarts_total"))
            srv.loop.call_soon_threadsafe(srv.kernel.kill, "vocoder")
            wait_for(lambda: srv.kernel.health()["vocoder"] != "up", timeout=5, every=0.01)
            if srv.kernel.health()["vocoder"] == "down":
                metrics = scrape()
                down_pids.append(_sample(metrics, "omni_stage_pid"))
                assert _sample(metrics, "omni_stage_down") == 1.0
        wait_for(lambda: srv.kernel.health()["vocoder"] == "up", timeout=30)
        metrics = scrape()
        seen.append(_sample(metrics, "omni_stage_restarts_total"))
    assert seen == [0.0, 1.0, 2.0, 3.0], seen
    assert down_pids == [None, None], down_pids  # max_restarts=1: every death after the first rests
    assert _sample(metrics, "omni_stage_cooldowns_total") == 2.0
    assert _sample(metrics, "omni_stage_restarts_in_window") == 1.0
    assert _sample(metrics, "omni_stage_pid") > 0


def test_a_restart_that_fails_to_come_up_is_counted_and_the_stage_is_retried():
    """A restart that does not come up (here: not ready within its start timeout) is
    `omni_stage_restart_failures_total`; the next try, once it can start, comes up; every counter only grew."""
    import asyncio
    import os
    import signal

    from kernel_helpers import graph
    from omni.api.metrics import ApiMetrics
    from omni.kernel.kernel import Kernel

    async def go():
        g = graph()
        vocoder = g.stage("vocoder")
        vocoder.max_restarts, vocoder.restart_cooldown_s = 5, 0.5
        scrapes = []
        async with Kernel(g, mode="process") as kernel:
            metrics = ApiMetrics()
            scrape = lambda stats: _sample(metrics.render(stats).decode(), "omni_stage_restart_failures_total")  # noqa: E731
            scrapes.append((await kernel.stats())["vocoder.0"])
            vocoder.start_timeout_s = 0.001  # the next launch cannot be ready in time
            os.kill(kernel.pid_of("vocoder"), signal.SIGKILL)
            for _ in range(200):
                await asyncio.sleep(0.05)
                stats = await kernel.stats()
                if stats["vocoder.0"]["restart_failures_total"] >= 1:
                    break
            failed = scrape(stats)
            scrapes.append(stats["vocoder.0"])
            vocoder.start_timeout_s = 60.0  # and now it can
            for _ in range(400):
                await asyncio.sleep(0.05)
                if kernel.health()["vocoder"] == "up":
                    break
            stats = await kernel.stats()
            scrapes.append(stats["vocoder.0"])
            events = await kernel.submit({"prompt": "hi", "max_tokens": 3}, deadline_s=30).collect()
            return failed, scrape(stats), scrapes, kernel.health()["vocoder"], events[-1].final

    failed, later, scrapes, health, served = asyncio.run(asyncio.wait_for(go(), 120))
    assert failed >= 1.0 and later >= failed, (failed, later)
    assert health == "up" and served
    for key in ("restarts_total", "restart_failures_total", "cooldowns_total"):
        values = [s[key] for s in scrapes]
        assert values == sorted(values), (key, values)
    assert scrapes[-1]["restarts_total"] >= scrapes[-1]["restart_failures_total"] + 1
