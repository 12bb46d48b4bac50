# SDPA on the CPU at llama-10m's attention shape (8 q heads, 4 kv heads, head_dim 32): the shapes the
# torch_ref/cpu_paged prefill path passes (bool mask + enable_gqa) vs alternatives.
import time, sys, torch, torch.nn.functional as F
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
def bench(fn, iters=5):
    fn(); t=[]
    for _ in range(iters):
        s=time.perf_counter(); fn(); t.append(time.perf_counter()-s)
    t.sort(); return 1000*t[len(t)//2]
for q_len, kv_len in ((2048, 2048), (2048, 8192), (256, 1536), (1500, 1500)):
    for dtype in (torch.float32, torch.bfloat16):
        q=torch.randn(1,8,q_len,32,dtype=dtype); k=torch.randn(1,4,kv_len,32,dtype=dtype); v=torch.randn_like(k)
        pos=torch.arange(kv_len-q_len, kv_len).unsqueeze(-1); mask=(torch.arange(kv_len) <= pos).unsqueeze(0).unsqueeze(0)
        kr, vr = k.repeat_interleave(2,1), v.repeat_interleave(2,1)
        rows = {
          "mask+gqa (engine)": lambda: F.scaled_dot_product_attention(q,k,v,attn_mask=mask,enable_gqa=True),
          "mask, kv repeated": lambda: F.scaled_dot_product_attention(q,kr,vr,attn_mask=mask),
          "float mask, kv rep": lambda: F.scaled_dot_product_attention(q,kr,vr,attn_mask=torch.zeros(mask.shape,dtype=dtype).masked_fill(~mask,float('-inf'))),
        }
        if q_len == kv_len:
            rows["is_causal+gqa"] = lambda: F.scaled_dot_product_attention(q,k,v,is_causal=True,enable_gqa=True)
            rows["is_causal, kv rep"] = lambda: F.scaled_dot_product_attention(q,kr,vr,is_causal=True)
        flops = 4*8*q_len*kv_len*32/1e9  # full (unmasked) QK^T + PV, GFLOP
        print(f"q={q_len} kv={kv_len} {str(dtype)[6:]}: " + "; ".join(f"{n} {bench(f):.1f} ms" for n,f in rows.items()) + f"  ({flops:.2f} GFLOP unmasked)", flush=True)
