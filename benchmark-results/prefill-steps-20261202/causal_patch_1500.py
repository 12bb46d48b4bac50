# Whole-step effect of is_causal for a fresh single-prompt prefill group (monkeypatched, engine untouched):
# one 1500-token step of llama-10m, original vs patched, interleaved.
import sys, torch, torch.nn.functional as F
sys.path.insert(0, "benchmarks")
import rapid_llm.ops.attention.torch_ref as tr
from prefill_step_timing import LockStep, run_once
from rapid_llm.server_args import ServerArgs
original = F.scaled_dot_product_attention
def causal_when_square(q, k, v, attn_mask=None, **kw):
    if attn_mask is not None and q.shape[0] == 1 and q.shape[2] == k.shape[2]:
        return original(q, k, v, is_causal=True, **kw)
    return original(q, k, v, attn_mask=attn_mask, **kw)
model = sys.argv[1]
engine = LockStep(ServerArgs(model=model, max_num_batched_tokens=2048, enable_prefix_caching=False,
                             kv_cache_memory="1GiB", max_model_len=1600, log_level="warning"), model)
torch.set_num_threads(1)
seed = 0
for repeat in range(4):
    for name, fn in (("mask", original), ("is_causal", causal_when_square)):
        tr.F.scaled_dot_product_attention = fn
        seed += 1
        result = run_once(engine, 1500, 1, 0, seed, engine.runner.model_config.vocab_size)
        print(repeat, name, round(1000 * result["prefill_s"], 1), "ms", flush=True)
tr.F.scaled_dot_product_attention = original
