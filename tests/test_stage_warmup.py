"""Start-up warm-up requests of the Qwen3-Omni AR stages (run on a GPU before the stage is ready,
so that no request compiles a kernel): they go through the serving path and leave nothing behind."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from omni.kernel.stage import StageContext  # noqa: E402
from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny  # noqa: E402
from omni.models.qwen3_omni.stages.talker_stage import TalkerStage  # noqa: E402
from omni.models.qwen3_omni.stages.thinker_stage import ThinkerStage  # noqa: E402

ENGINE = {"block_size": 8, "num_blocks": 64, "max_model_len": 256, "max_num_batched_tokens": 128}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(make_tiny(tmp_path_factory.mktemp("tiny-a"), seed=0, preset="tiny-a"))


@pytest.mark.parametrize("kind", [ThinkerStage, TalkerStage])
def test_warm_requests_run_to_the_end_and_leave_nothing(ckpt, kind):
    ports = {"in_ports": ["in"], "out_ports": ["text", "hidden"]} if kind is ThinkerStage else {"in_ports": ["hidden"]}
    stage = kind(StageContext(kind.__name__, args={"model_dir": ckpt, **ENGINE}, **ports))
    stage.setup()  # on CPU: no warm-up here
    assert stage.engine.num_steps == 0
    lengths = stage.warm_lengths()
    assert lengths == [2, 5, 9, 17, 33, 65, 128]  # capped by the step's token budget (chunked prefill covers the rest)
    assert stage.warm_up(force=True) == len(lengths)
    assert stage.engine.num_steps >= len(lengths) and not stage.engine.seqs and not stage.engine.has_unfinished()
    blocks = stage.engine.scheduler.blocks
    assert blocks.num_free_blocks == blocks.num_blocks  # every warm-up block returned
    # warm prompts share prefixes: with the cache on they would skip the prefills they compile
    assert blocks.caching and blocks.num_cached_free_blocks == 0 and blocks.queried_tokens == 0
    computed = stage.engine.stats()["num_computed_tokens"]
    assert computed >= sum(lengths)


def test_code2wav_warm_up_decodes_first_and_steady_chunks(ckpt):
    from omni.models.qwen3_omni.stages.code2wav_stage import Code2WavStage

    stage = Code2WavStage(StageContext("code2wav", args={"model_dir": ckpt}))
    stage.setup()  # on CPU: no warm-up here
    assert stage.codec is not None
    stage.warm_up((1, 2))  # what a GPU stage runs before it is ready
    assert not stage.requests and not stage.has_work()
