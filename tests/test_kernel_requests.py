"""The kernel on the demo pipeline: parity across modes, concurrency, admission, cancel, deadlines."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest
import zmq

from kernel_helpers import graph, probe_graph, run_one, shm_segments, summarize
from omni.cluster.addresses import endpoint
from omni.kernel.errors import DeadlineExceeded, InvalidRequest, Overloaded, RequestCancelled
from omni.kernel.kernel import Kernel

PROMPTS = ["hello there", "a much longer prompt " * 12, "x", "omni streams audio while the thinker talks"]


async def _outputs(mode: str, channel: str) -> list[dict]:
    async with Kernel(graph(channel), mode=mode) as kernel:
        results = await asyncio.gather(*(run_one(kernel, p, max_tokens=10 + i) for i, p in enumerate(PROMPTS)))
        assert not shm_segments(kernel.instance) or channel != "inline"
    return results


@pytest.mark.parametrize("channel", ["auto", "shm", "inline"])
def test_inline_and_process_modes_give_identical_outputs(channel):
    inline = asyncio.run(_outputs("inline", channel))
    process = asyncio.run(_outputs("process", channel))
    for a, b, prompt in zip(inline, process, PROMPTS):
        assert a["tokens"] == b["tokens"] and len(a["tokens"]) == 10 + PROMPTS.index(prompt)
        assert a["text"] == b["text"]
        np.testing.assert_array_equal(a["audio"], b["audio"])
        assert a["audio"].size == 480 * len(a["tokens"])
        assert a["final"]["usage"]["completion_tokens"] == len(a["tokens"])


def test_batched_equals_alone():
    async def main():
        async with Kernel(graph(), mode="inline") as kernel:
            alone = [await run_one(kernel, p) for p in PROMPTS]
            together = await asyncio.gather(*(run_one(kernel, p) for p in PROMPTS))
            stats = await kernel.stats()
        return alone, together, stats

    alone, together, stats = asyncio.run(main())
    assert [a["tokens"] for a in alone] == [t["tokens"] for t in together]
    assert stats["generator.0"]["steps"] < 12 * len(PROMPTS) * 2  # the concurrent ones shared steps


def test_64_concurrent_streaming_requests_complete():
    async def main():
        async with Kernel(graph(), mode="process", max_inflight=64) as kernel:
            results = await asyncio.gather(*(run_one(kernel, f"request number {i}", max_tokens=20) for i in range(64)))
            stats = await kernel.stats()
        return results, stats

    results, stats = asyncio.run(main())
    assert all(len(r["tokens"]) == 20 and r["audio"].size == 20 * 480 for r in results)
    assert stats["generator.0"]["completed"] == 64 and stats["kernel"]["in_flight"] == 0


def test_admission_overflow_raises_overloaded():
    async def main():
        async with Kernel(graph(generator={"step_delay_s": 0.02}), mode="inline", max_inflight=4) as kernel:
            streams = [kernel.submit({"prompt": "p", "max_tokens": 5}) for _ in range(4)]
            with pytest.raises(Overloaded):
                kernel.submit({"prompt": "p"})
            results = [summarize(await s.collect()) for s in streams]
            after = await run_one(kernel, "p", max_tokens=3)  # capacity is back
        return results, after

    results, after = asyncio.run(main())
    assert all(len(r["tokens"]) == 5 for r in results) and len(after["tokens"]) == 3


@pytest.mark.parametrize("mode", ["inline", "process"])
def test_cancel_frees_state_in_every_stage(mode):
    async def main():
        async with Kernel(graph(generator={"step_delay_s": 0.01}), mode=mode) as kernel:
            stream = kernel.submit({"prompt": "long one", "max_tokens": 100000})
            got = []
            with pytest.raises(RequestCancelled):
                async for event in stream:
                    got.append(event)
                    if len(got) == 5:
                        busy = await kernel.stats()
                        await stream.cancel()
            await asyncio.sleep(0.3)
            idle = await kernel.stats()
        return got, busy, idle

    got, busy, idle = asyncio.run(main())
    assert busy["generator.0"]["in_flight"] == 1 and busy["generator.0"]["running"] == 1
    for name in ("encoder.0", "generator.0", "vocoder.0"):
        assert idle[name]["in_flight"] == 0, name
    assert idle["generator.0"]["running"] == 0 and idle["vocoder.0"]["buffered_frames"] == 0
    assert idle["generator.0"]["aborted"] == 1


def test_cancelled_stream_raises():
    async def main():
        async with Kernel(graph(generator={"step_delay_s": 0.01}), mode="inline") as kernel:
            stream = kernel.submit({"prompt": "p", "max_tokens": 1000})
            await kernel.cancel(stream.rid)
            with pytest.raises(RequestCancelled):
                await stream.collect()

    asyncio.run(main())


def test_deadline_ends_request_with_typed_error_and_frees_state():
    async def main():
        async with Kernel(graph(generator={"step_delay_s": 0.01}), mode="inline") as kernel:
            with pytest.raises(DeadlineExceeded):
                await kernel.submit({"prompt": "p", "max_tokens": 100000}, deadline_s=0.3).collect()
            await asyncio.sleep(0.2)
            return await kernel.stats()

    stats = asyncio.run(main())
    assert stats["generator.0"]["in_flight"] == 0


def test_bad_request_is_a_typed_error_and_the_stage_lives():
    async def main():
        async with Kernel(graph(), mode="process") as kernel:
            with pytest.raises(InvalidRequest, match="max_tokens"):
                await kernel.submit({"prompt": "p", "max_tokens": -3}).collect()
            with pytest.raises(InvalidRequest, match="prompt"):
                await kernel.submit({"prompt": ""}).collect()
            ok = await run_one(kernel, "still fine", max_tokens=4)
            return ok, kernel.health()

    ok, health = asyncio.run(main())
    assert len(ok["tokens"]) == 4 and set(health.values()) == {"up"}


def test_garbage_on_a_stage_socket_is_dropped():
    async def main():
        async with Kernel(graph(), mode="process") as kernel:
            ctx = zmq.Context.instance()
            sock = ctx.socket(zmq.PUSH)
            sock.connect(endpoint(kernel.run_dir, "generator.0"))
            for junk in (b"\x00garbage", b"\x81\xa2op\xa5bogus", os.urandom(64), b""):
                sock.send(junk)
            sock.send_multipart([b"\x82\xa2op\xabrequestopen\xa3rid\x05", b"extra"])  # wrong type for rid
            sock.close(linger=1000)
            await asyncio.sleep(0.3)
            ok = await run_one(kernel, "after garbage", max_tokens=4)
            return ok, await kernel.stats()

    ok, stats = asyncio.run(main())
    assert len(ok["tokens"]) == 4
    assert stats["generator.0"]["dropped_messages"] >= 4 and stats["generator.0"]["state"] == "up"


def test_two_kernels_side_by_side():
    async def main():
        async with Kernel(graph(), mode="process") as a, Kernel(graph(), mode="process") as b:
            assert a.run_dir != b.run_dir and a.instance != b.instance
            ra, rb = await asyncio.gather(run_one(a, "same prompt"), run_one(b, "same prompt"))
        return ra, rb

    ra, rb = asyncio.run(main())
    assert ra["tokens"] == rb["tokens"] and len(ra["tokens"]) == 12


@pytest.mark.parametrize("mode", ["inline", "process"])
def test_a_final_edge_delivers_its_chunks_only_once_the_producer_finishes(mode):
    """mode="final": the generator's text is held back until the generator ends the request, then
    sent whole and in order, while its frames stream to the vocoder meanwhile."""
    async def main(text_mode):
        g = graph(generator={"step_delay_s": 0.01})
        next(e for e in g.edges if e.port == "text").mode = text_mode
        async with Kernel(g, mode=mode) as kernel:
            return await kernel.submit({"prompt": "hold the text back", "max_tokens": 16}).collect()

    streamed, held = asyncio.run(main("stream")), asyncio.run(main("final"))
    assert summarize(held)["tokens"] == summarize(streamed)["tokens"] and len(summarize(held)["tokens"]) == 16
    np.testing.assert_array_equal(summarize(held)["audio"], summarize(streamed)["audio"])
    ports = [e.port for e in held if not e.final]
    assert ports.index("audio") < ports.index("text")  # audio streamed before any text was sent
    assert ports.count("text") == 16
    streamed_ports = [e.port for e in streamed if not e.final]
    assert streamed_ports.index("text") < streamed_ports.index("audio")


@pytest.mark.parametrize("media", [False, True])
def test_media_reach_only_the_stages_that_take_them_and_sampling_arrives_typed(media):
    """The entry's Open holds the request whole; a later stage gets the media keys only when it
    takes media. Each stage's sampling arrives as the typed `Sampling` the kernel checked."""
    async def main():
        async with Kernel(probe_graph(media), mode="inline") as kernel:
            params = {"blob": b"\0" * 4096, "task": "x", "sampling": {"later": {"temperature": 0.5}}}
            return await kernel.submit(params).collect()

    seen = {e.data["stage"]: e.data for e in asyncio.run(main()) if e.port == "seen"}
    assert seen["entry"]["keys"] == ["blob", "sampling", "task"]
    assert seen["later"]["keys"] == (["blob", "sampling", "task"] if media else ["sampling", "task"])
    assert seen["later"]["sampling"] == seen["entry"]["sampling"] == {"later": "Sampling"}


def test_a_media_stage_opened_by_one_without_media_is_refused():
    from omni.kernel.errors import GraphError

    g = probe_graph(media=True)
    g.stages.append(type(g.stages[0])("last", "kernel_helpers:ParamsProbe", media=True))
    g.edges.append(type(g.edges[0])("later", "next", "last"))
    g.stages[1].media = False
    with pytest.raises(GraphError, match="takes media"):
        g.validate()


def test_bad_sampling_from_a_library_caller_is_refused_before_it_runs():
    async def main():
        async with Kernel(graph(), mode="inline") as kernel:
            with pytest.raises(InvalidRequest, match="temperature"):
                kernel.submit({"prompt": "x", "sampling": {"generator": {"temperature": -1}}})
            assert kernel.inflight == 0

    asyncio.run(main())
