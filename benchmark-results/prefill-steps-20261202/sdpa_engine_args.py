# Capture the engine's own SDPA arguments during one prefill (llama-10m), then time that call as captured,
# with contiguous copies, and with is_causal instead of the mask (valid: a fresh prompt, no context).
import sys, time, torch, torch.nn.functional as F
sys.argv = ["x", "--model", sys.argv[1], "--prompt-len", sys.argv[2], "--budgets", sys.argv[3], "--repeats", "1"]
import rapid_llm.ops.attention.torch_ref as tr
captured = []
real = F.scaled_dot_product_attention
def spy(*a, **k):
    if not captured and a[0].shape[2] > 8:
        captured.append((a, k))
    return real(*a, **k)
tr.F.scaled_dot_product_attention = spy
sys.path.insert(0, "benchmarks")
import prefill_step_timing
prefill_step_timing.main()
tr.F.scaled_dot_product_attention = real
(q, k, v), kw = captured[0]
print("q", tuple(q.shape), q.stride(), q.dtype, "k", tuple(k.shape), k.stride(), k.dtype, "mask", tuple(kw["attn_mask"].shape), kw["attn_mask"].dtype, "gqa", kw["enable_gqa"])
def bench(fn, n=5):
    fn(); t=[]
    for _ in range(n):
        s=time.perf_counter(); fn(); t.append(time.perf_counter()-s)
    return 1000*sorted(t)[n//2]
torch.set_num_threads(1)
qc, kc, vc = q.contiguous(), k.contiguous(), v.contiguous()
print("as captured %.1f ms" % bench(lambda: real(q, k, v, **kw)))
print("contiguous %.1f ms" % bench(lambda: real(qc, kc, vc, **kw)))
kw2 = {x: y for x, y in kw.items() if x != "attn_mask"}
if q.shape[2] == k.shape[2]:
    print("is_causal, as captured %.1f ms" % bench(lambda: real(q, k, v, is_causal=True, **kw2)))
    print("is_causal, contiguous %.1f ms" % bench(lambda: real(qc, kc, vc, is_causal=True, **kw2)))
