"""bench/soak.py's figures and omni/census.py's census (issue 25, point 4): the census counts the
tensors a process holds and names who holds them; the soak reports first vs last minute."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from omni import census

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from soak import minute_figures  # noqa: E402


class _Cache:
    pass


def test_the_census_counts_held_tensors_and_names_their_holder():
    before = census.snapshot()["tensors"]["count"]
    holder = _Cache()
    # many, so that they are the commonest shape even beside what earlier tests of the session left alive
    holder.kept = [torch.zeros(3, 7, dtype=torch.int16) for _ in range(20000)]
    after = census.snapshot()
    assert after["tensors"]["count"] - before >= 20000 and after["rss_bytes"] > 0
    assert dict(after["tensors"]["top_shapes"])["torch.int16[3, 7]@cpu"] == 20000
    assert any("kept" in chain for chain in after["tensors"]["holders"]["torch.int16[3, 7]@cpu"])
    del holder


def test_the_soak_reports_first_and_last_minute_per_process():
    samples = [{"t": t, "procs": {"thinker.0": ((100 + t // 60 * 10) * 2**20, 30)}} for t in range(0, 600, 5)]
    figures = minute_figures(samples, 600)["thinker.0"]
    assert figures["rss_mb_first_min"] == 100 and figures["rss_mb_last_min"] == 190
    assert figures["rss_mb_change"] == 90 and figures["fds_last_min"] == 30
