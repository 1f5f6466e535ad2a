"""Several GPUs of one host: per-replica devices in the graph spec, the automatic plan behind
`omnid serve --gpus`, the channel an edge picks from placement, and NVLink multicast kept off in
every process omni starts."""

from __future__ import annotations

from unittest import mock

import pytest

from omni.transport.channels import Readers, channel_of
from omni.kernel.errors import GraphError
from omni.gpu_env import MULTICAST_OFF, keep_multicast_off
from omni.config import apply_overrides
from omni.kernel.graph import OUT, EdgeSpec, Graph, StageSpec
from omni.placement import parse_gpus, place, plan, process_devices


def _speech_graph(talkers: int = 1, vocoders: int = 1, thinker_args: dict | None = None) -> Graph:
    """The shape of Qwen3-Omni's speech graph, its loads (kinds do not matter to placement)."""
    stages = [StageSpec("preprocess", "k"), StageSpec("audio_encoder", "k", device="cuda", load=0.5),
              StageSpec("thinker", "k", device="cuda", args=dict(thinker_args or {}), load=8.0),
              StageSpec("talker", "k", device="cuda", replicas=talkers, load=3.0),
              StageSpec("code2wav", "k", device="cuda", replicas=vocoders, load=2.0)]
    edges = [EdgeSpec("preprocess", "audio", "audio_encoder"), EdgeSpec("audio_encoder", "embeds", "thinker"),
             EdgeSpec("preprocess", "tokens", "thinker"), EdgeSpec("thinker", "hidden", "talker"),
             EdgeSpec("talker", "codes", "code2wav"), EdgeSpec("thinker", "text", OUT),
             EdgeSpec("code2wav", "audio", OUT)]
    return Graph("speech", stages, edges, entry="preprocess")


def test_one_gpu_puts_every_gpu_stage_there():
    assert plan(_speech_graph(talkers=2).stages, [3]) == {
        "audio_encoder": ["cuda:3"], "thinker": ["cuda:3"], "talker": ["cuda:3", "cuda:3"], "code2wav": ["cuda:3"]}


def test_thinker_alone_on_the_first_gpu_and_the_replicas_spread_over_the_rest():
    got = plan(_speech_graph(talkers=2, vocoders=2).stages, [0, 1, 2])
    assert got["thinker"] == ["cuda:0"]
    assert sorted(got["talker"]) == ["cuda:1", "cuda:2"] and sorted(got["code2wav"]) == ["cuda:1", "cuda:2"]
    assert got["audio_encoder"][0] in ("cuda:1", "cuda:2")  # never beside the thinker
    assert "preprocess" not in got  # a CPU stage stays on the CPU
    # two GPUs: everything but the thinker on the second
    got = plan(_speech_graph().stages, [0, 1])
    assert got == {"audio_encoder": ["cuda:1"], "thinker": ["cuda:0"], "talker": ["cuda:1"], "code2wav": ["cuda:1"]}


def test_the_load_decides_the_split():
    # one talker and one code2wav on two spare GPUs: each gets its own (the encoder joins the lighter)
    got = plan(_speech_graph().stages, [4, 5, 6])
    assert got["thinker"] == ["cuda:4"] and {got["talker"][0], got["code2wav"][0]} == {"cuda:5", "cuda:6"}
    assert got["audio_encoder"] == got["code2wav"]
    # a heavier code2wav than thinker moves the anchor
    got = plan(_speech_graph().stages, [0, 1], load={"code2wav": 20.0})
    assert got["code2wav"] == ["cuda:0"] and got["thinker"] == ["cuda:1"]


def test_a_tensor_parallel_thinker_takes_consecutive_gpus():
    got = plan(_speech_graph(talkers=2, thinker_args={"tensor_parallel_size": 2}).stages, [0, 1, 2, 3])
    assert got["thinker"] == ["cuda:0"]  # ranks on cuda:0 and cuda:1
    assert sorted(got["talker"]) == ["cuda:2", "cuda:3"] and got["code2wav"][0] in ("cuda:2", "cuda:3")
    with pytest.raises(GraphError, match="consecutive"):
        plan(_speech_graph(thinker_args={"tensor_parallel_size": 2}).stages, [0, 2, 3])
    with pytest.raises(GraphError, match="consecutive"):
        plan(_speech_graph(thinker_args={"tensor_parallel_size": 2}).stages, [0, 7])
    with pytest.raises(GraphError, match="need 4 GPUs"):
        plan(_speech_graph(thinker_args={"tensor_parallel_size": 4}).stages, [0, 1, 2])


def test_place_writes_devices_and_keeps_pinned_stages():
    graph = place(_speech_graph(talkers=2), [0, 1, 2], keep={"code2wav"})
    spec = graph.stage("talker")
    assert spec.devices == ["cuda:1", "cuda:2"] and spec.device == "cuda:1"
    assert [spec.device_of(r) for r in range(2)] == spec.devices
    assert graph.stage("code2wav").device == "cuda" and graph.stage("code2wav").devices == []


def test_every_process_has_a_device_ranks_included():
    graph = place(_speech_graph(talkers=2, thinker_args={"tensor_parallel_size": 2}), [0, 1, 2, 3])
    # preprocess; thinker ranks 0 and 1; the encoder, two talkers and code2wav on the rest (MPS decides on these)
    assert sorted(process_devices(graph)) == ["cpu", "cuda:0", "cuda:1", "cuda:2", "cuda:2", "cuda:3", "cuda:3"]


def test_parse_gpus():
    assert parse_gpus("0,1, 2") == [0, 1, 2]
    for bad in ("", "a", "0,0", "-1"):
        with pytest.raises(GraphError, match="--gpus"):
            parse_gpus(bad)


# ---- per-replica devices in the spec --------------------------------------------------------

def test_devices_are_one_per_replica():
    graph = _speech_graph(talkers=2)
    apply_overrides(graph, {"talker": {"devices": ["cuda:1", "cuda:2"]}})
    assert graph.stage("talker").all_devices() == ["cuda:1", "cuda:2"]
    assert Graph.from_dict(graph.to_dict()).stage("talker").device_of(1) == "cuda:2"  # survives the trip to a process
    for bad, why in ((["cuda:1"], "one device per replica"), ([1, 2], "talker.devices: Expected `str`, got `int`")):
        with pytest.raises(GraphError, match=why):
            apply_overrides(graph, {"talker": {"devices": bad}})


def test_an_edge_uses_cuda_ipc_only_when_every_replica_of_both_ends_is_on_a_gpu():
    graph = _speech_graph(talkers=2)
    edge = next(e for e in graph.edges if e.src == "thinker" and e.dst == "talker")
    assert channel_of(graph, edge) == "cuda_ipc"
    graph.stage("talker").devices = ["cuda:1", "cpu"]
    assert channel_of(graph, edge) == "shm"


def test_each_replica_gets_its_device_and_its_readers_copy_there():
    from omni.kernel.driver import StageDriver

    graph = Graph("g", [StageSpec("s", "omni.models.demo.stages:ToyGenerator", replicas=2, devices=["cpu", "cuda:1"])],
                  [EdgeSpec("s", "text", OUT)])
    assert [StageDriver(graph, "s", r).ctx.device for r in range(2)] == ["cpu", "cuda:1"]
    assert Readers("cuda:1").get("cuda_ipc").device == "cuda:1"


# ---- NVLink multicast off ---------------------------------------------------------------------

def test_multicast_variables_are_set_where_unset_and_kept_where_set():
    env = keep_multicast_off({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "7"})
    assert env == {**MULTICAST_OFF, "TORCH_SYMM_MEM_DISABLE_MULTICAST": "7"}
    assert MULTICAST_OFF["NCCL_NVLS_ENABLE"] == "0"


def test_a_stage_process_gets_them_even_from_a_bare_parent(monkeypatch):
    import asyncio

    from omni.kernel.supervisor import ActorHandle, Supervisor

    for key in MULTICAST_OFF:
        monkeypatch.delenv(key, raising=False)
    supervisor = Supervisor(_speech_graph(), "process", "i", lambda handle, reason: [], 5.0, "WARNING", {"OTHER": "1"})
    supervisor.run_dir = "/tmp"
    popen = mock.MagicMock()

    async def launch():
        with mock.patch("omni.cluster.local.subprocess.Popen", popen):
            supervisor._launch(ActorHandle("thinker", 0))

    asyncio.run(launch())
    env = popen.call_args.kwargs["env"]
    assert {k: env[k] for k in MULTICAST_OFF} == MULTICAST_OFF
