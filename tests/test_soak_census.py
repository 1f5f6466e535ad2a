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
    assert figures["rss_mb_second_min"] == 110 and figures["rss_mb_change_from_second_min"] == 80


def test_a_process_that_only_warmed_up_shows_no_change_from_the_second_minute():
    """omnid's case: idle at the first sample, warm after its first requests, flat from then on."""
    samples = [{"t": t, "procs": {"omnid": ((60 if t == 0 else 262) * 2**20, 51)}} for t in range(0, 600, 5)]
    figures = minute_figures(samples, 600)["omnid"]
    assert figures["rss_mb_change"] > 15 and figures["rss_mb_change_from_second_min"] == 0


def _census_file(directory: Path, name: str, pid: int, n: int, rss_mb: float, objects: int) -> None:
    import json

    body = {"time": 1000.0 + 60 * n, "pid": pid, "rss_bytes": int(rss_mb * 2**20), "gc_objects": objects,
            "top_types": [["dict", objects // 2]], "tensors": None,
            "heap": {"in_use_bytes": 50 * 2**20, "from_os_bytes": 60 * 2**20}, "rss_after_trim_bytes": int(rss_mb * 2**20)}
    (directory / f"{name}-{pid}-{n}.json").write_text(json.dumps(body))


def test_the_census_change_keeps_every_census_in_order(tmp_path):
    from soak import census_change

    for n in range(1, 12):  # 11 censuses: the 10th and 11th sort after the 9th
        _census_file(tmp_path, "omnid", 7, n, 200 + min(n, 4), 1000 + 10 * n)
    change = census_change(tmp_path)["omnid-7"]
    assert [s["t"] for s in change["series"]] == [60.0 * i for i in range(11)]
    assert change["rss_mb"] == [201.0, 204.0] and change["gc_objects"] == [1010, 1110]
    assert [s["rss_mb"] for s in change["series"]][3:] == [204.0] * 8  # the plateau shows


def test_omnid_writes_its_own_census_at_sigusr1(tmp_path, monkeypatch):
    """bench/soak.py --census sends omnid SIGUSR1 too: it writes its census like a stage and serves on."""
    import json
    import os
    import signal
    import time

    import requests

    from test_api_cli import omnid, read_until_listening

    monkeypatch.setenv("OMNI_CENSUS_DIR", str(tmp_path))
    proc = omnid("serve", "--model", "demo", "--port", "0")
    try:
        url, _ = read_until_listening(proc)
        os.kill(proc.pid, signal.SIGUSR1)
        path = tmp_path / f"omnid-{proc.pid}-1.json"
        deadline = time.monotonic() + 30
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        body = json.loads(path.read_text())
        assert body["pid"] == proc.pid and body["rss_bytes"] > 0 and body["gc_objects"] > 1000
        assert body["heap"] is None or body["heap"]["in_use_bytes"] > 0
        assert requests.get(url + "/health", timeout=10).status_code == 200  # serving on
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


CHILD = """
import os, signal, sys, time
directory, name, mode = sys.argv[1], sys.argv[2], sys.argv[3]
def census(*_):
    got = time.time()
    time.sleep(0.4)  # a census takes a while
    path = os.path.join(directory, f"{name}-{os.getpid()}-1.json")
    open(path + ".partial", "w").write(f"{got} {time.time()}")
    os.replace(path + ".partial", path)
signal.signal(signal.SIGUSR1, census if mode == "census" else signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""


def test_a_census_round_takes_one_process_at_a_time(tmp_path):
    """All processes walking their objects at once on a small machine kept every stage past the
    kernel's heartbeat timeout (the supervisor killed them all mid-soak): one at a time now."""
    import asyncio
    import subprocess

    from soak import census_round

    procs = {name: subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), name, mode], stdout=subprocess.PIPE,
                                    text=True)
             for name, mode in (("a", "census"), ("b", "census"), ("c", "census"), ("deaf", "ignore"))}
    try:
        for p in procs.values():
            assert p.stdout.readline().strip() == "ready"
        missing = asyncio.run(census_round({n: p.pid for n, p in procs.items()}, tmp_path, 1, timeout_s=2.0))
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
    assert missing == ["deaf"]
    spans = sorted(tuple(map(float, next(tmp_path.glob(f"{n}-*-1.json")).read_text().split())) for n in "abc")
    assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:])), spans  # never two at once


def test_the_soak_reads_each_stages_restarts_from_metrics():
    from soak import stage_restarts, table

    metrics = ('omni_stage_restarts_total{stage="thinker.0"} 2.0\n'
               'omni_stage_restarts_total{stage="whisper-tiny.en/decoder.0"} 0.0\nomni_stage_pid{stage="thinker.0"} 7.0\n')
    assert stage_restarts(metrics) == {"thinker.0": 2, "whisper-tiny.en/decoder.0": 0}
    report = {"processes": {}, "requests": {"text": {"ok": 1, "failed": 0}}, "stage_restarts": stage_restarts(metrics)}
    assert "stage restarts: {'thinker.0': 2}" in table(report)
    assert table({**report, "stage_restarts": {"thinker.0": 0}}).endswith("stage restarts: none")
