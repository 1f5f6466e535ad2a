import torch, transformers
torch.set_num_threads(1)
from omni.models.qwen2_5_omni.modules.thinker import Qwen2_5OmniThinker
from omni.layers.tokenizer_offline import token_ids
from omni.stages.ar.config import EngineConfig
from omni.stages.ar.engine import AREngine
from omni.stages.ar.sequence import SamplingParams
IDS=token_ids()
for ck in ['/tmp/q25a','/tmp/q25b']:
    hf = transformers.Qwen2_5OmniForConditionalGeneration.from_pretrained(ck).eval()
    th = Qwen2_5OmniThinker.from_checkpoint(ck)
    prompt=[IDS["<|im_start|>"], IDS["user"], 10, *list(b"hello there, how are you?"), IDS["<|im_end|>"], 10, IDS["<|im_start|>"], IDS["assistant"], 10]
    with torch.no_grad():
        out = hf.thinker.generate(torch.tensor([prompt]), attention_mask=torch.ones(1,len(prompt),dtype=torch.long), max_new_tokens=16, do_sample=False, eos_token_id=IDS["<|im_end|>"])
    ref = out[0, len(prompt):].tolist()
    eng = AREngine(th, EngineConfig(block_size=4, num_blocks=64, max_model_len=128, eos_token_ids=(IDS["<|im_end|>"],)))
    s = eng.add_request("a", prompt, SamplingParams(temperature=0.0, max_tokens=16))
    while eng.has_unfinished(): eng.step()
    print(ck, ref, s.output_token_ids, ref == s.output_token_ids)
