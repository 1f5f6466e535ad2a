"""Tiny Qwen3-Omni checkpoints: they load in transformers and through omni's own loader."""

from __future__ import annotations

import json

import pytest
import torch

from omni.models.qwen3_omni.config import detect_family, load_config
from omni.models.qwen3_omni.checkpoint.make_tiny import main as make_tiny_main
from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
from omni.models.qwen3_omni.checkpoint.tiny_presets import PRESETS
from omni.layers.tokenizer_offline import token_ids
from omni.models.weights import CheckpointError, load_into, load_state_dict, tensor_names

PRESET_NAMES = sorted(PRESETS)


@pytest.fixture(scope="module", params=PRESET_NAMES)
def tiny(request, tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp(request.param), seed=0, preset=request.param), request.param


def test_presets_differ():
    shapes = {
        (p.thinker_layers, p.thinker_hidden, p.thinker_experts, p.num_code_groups, p.codebook_size)
        for p in PRESETS.values()
    }
    assert len(PRESETS) >= 3 and len(shapes) == len(PRESETS)


# transformers renames the published (on-disk) layout in memory; omni reads the disk layout
MEMORY_TO_DISK = (
    ("thinker.model.audio_tower.", "thinker.audio_tower."),
    ("thinker.model.visual.", "thinker.visual."),
    ("thinker.model.language_model.", "thinker.model."),
)


def _disk_name(name: str) -> str:
    for mem, disk in MEMORY_TO_DISK:
        if name.startswith(mem):
            return disk + name[len(mem):]
    return name


def test_transformers_loads_and_matches_omni_loader(tiny):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    path, _ = tiny
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(path)).eval()
    ours = load_state_dict(path, "")
    used = set()
    for name, tensor in model.state_dict().items():
        disk = _disk_name(name)
        if disk.endswith("mlp.experts.gate_up_proj"):  # fused in memory, one tensor per expert on disk
            base = disk[: -len("gate_up_proj")]
            for e in range(tensor.shape[0]):
                gate, up = ours[f"{base}{e}.gate_proj.weight"], ours[f"{base}{e}.up_proj.weight"]
                assert torch.equal(tensor[e], torch.cat([gate, up])), f"{name}[{e}]"
                used |= {f"{base}{e}.gate_proj.weight", f"{base}{e}.up_proj.weight"}
        elif disk.endswith("mlp.experts.down_proj"):
            base = disk[: -len("down_proj")]
            for e in range(tensor.shape[0]):
                assert torch.equal(tensor[e], ours[f"{base}{e}.down_proj.weight"]), f"{name}[{e}]"
                used.add(f"{base}{e}.down_proj.weight")
        else:
            assert torch.equal(tensor, ours[disk]), name
            used.add(disk)
    assert used == set(ours)
    assert {n.split(".")[0] for n in ours} == {"thinker", "talker", "code2wav"}


def test_config_view_matches_constraints(tiny):
    path, preset_name = tiny
    preset = PRESETS[preset_name]
    cfg = load_config(path)
    ids = token_ids()
    assert detect_family(path) == "qwen3_omni"
    text = cfg.thinker.text
    assert (text.num_layers, text.hidden_size, text.num_experts) == (
        preset.thinker_layers, preset.thinker_hidden, preset.thinker_experts)
    assert sum(text.mrope_section) * 2 == text.head_dim
    assert cfg.talker.text.vocab_size == cfg.code2wav.codebook_size + 1024
    assert cfg.talker.text.num_experts == preset.talker_experts
    assert cfg.talker.text.shared_expert_intermediate_size > 0
    assert cfg.talker.code_predictor.vocab_size == cfg.code2wav.codebook_size
    assert cfg.talker.code_predictor.hidden_size == cfg.talker.text.hidden_size
    assert cfg.talker.num_code_groups == cfg.code2wav.num_quantizers == preset.num_code_groups
    assert cfg.talker.thinker_hidden_size == text.hidden_size
    assert cfg.talker.accept_hidden_layer <= text.num_layers
    low = cfg.talker.text.vocab_size - 1024
    for codec_id in (cfg.talker.codec_pad_id, cfg.talker.codec_bos_id, cfg.talker.codec_eos_token_id,
                     *cfg.talker.speaker_id.values()):
        assert low <= codec_id < cfg.talker.text.vocab_size
    assert {"chelsie", "ethan"} <= set(cfg.talker.speaker_id)
    assert cfg.im_start_token_id == ids["<|im_start|>"] and cfg.assistant_token_id == ids["assistant"]
    assert cfg.thinker.audio_token_id == ids["<|audio_pad|>"]
    assert cfg.thinker.image_token_id == ids["<|image_pad|>"]
    raw = json.loads((path / "config.json").read_text())
    assert raw["talker_config"]["spatial_merge_size"] == 2


def test_tokenizer_reloads_with_chat_template(tiny):
    from transformers import AutoTokenizer

    path, _ = tiny
    tok = AutoTokenizer.from_pretrained(str(path))
    cfg = load_config(path)
    assert len(tok) == cfg.thinker.text.vocab_size
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "hi, user"}], tokenize=False, add_generation_prompt=True)
    ids = tok(prompt)["input_ids"]
    assert ids[-3:-1] == [cfg.im_start_token_id, cfg.assistant_token_id]
    assert ids[:2] == [cfg.im_start_token_id, cfg.user_token_id]
    assert tok.decode(ids) == prompt
    assert tok.convert_tokens_to_ids(tok.audio_token) == cfg.thinker.audio_token_id
    assert tok.eos_token_id == cfg.im_end_token_id


def test_same_seed_same_bytes_and_cli(tmp_path):
    a = make_tiny(tmp_path / "a", seed=3)
    assert make_tiny_main([str(tmp_path / "b"), "--seed", "3", "--preset", "tiny-a"]) == 0
    c = make_tiny(tmp_path / "c", seed=4)
    b = tmp_path / "b"
    sa, sb, sc = (load_state_dict(p, "code2wav") for p in (a, b, c))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["code_embedding.weight"], sc["code_embedding.weight"])
    size = sum(f.stat().st_size for f in a.iterdir())
    assert size < 8 << 20


def test_sharded_checkpoint_and_errors(tmp_path):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    src = make_tiny(tmp_path / "src")
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(src))
    model.save_pretrained(str(tmp_path / "sharded"), max_shard_size="200KB")
    sharded = tmp_path / "sharded"
    assert (sharded / "model.safetensors.index.json").is_file()
    a, b = load_state_dict(src, "thinker.audio_tower"), load_state_dict(sharded, "thinker.audio_tower")
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    half = load_state_dict(src, "code2wav", dtype=torch.bfloat16)
    assert half["code_embedding.weight"].dtype == torch.bfloat16
    assert tensor_names(src, "code2wav.code_embedding") == ["weight"]
    with pytest.raises(CheckpointError, match="starts with"):
        load_state_dict(src, "no_such_part")
    with pytest.raises(CheckpointError, match="missing tensors"):
        load_state_dict(src, "code2wav", expect=["not_there.weight"])
    with pytest.raises(CheckpointError, match="does not exist"):
        load_state_dict(tmp_path / "nowhere", "code2wav")
    shard = sorted(sharded.glob("model-*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(CheckpointError, match="missing"):
        load_state_dict(sharded, "code2wav")


def test_load_into_checks_shapes(tmp_path):
    src = make_tiny(tmp_path / "src")
    good = torch.nn.Embedding(64 * 4, 32)
    bad = torch.nn.Embedding(10, 32)
    load_into(torch.nn.ModuleDict({"code_embedding": good}), src, "code2wav", allow_unused=True)
    with pytest.raises(CheckpointError, match="shape"):
        load_into(torch.nn.ModuleDict({"code_embedding": bad}), src, "code2wav", allow_unused=True)
    with pytest.raises(CheckpointError, match="lacks"):
        load_into(torch.nn.ModuleDict({"code_embedding": good}), src, "code2wav")
