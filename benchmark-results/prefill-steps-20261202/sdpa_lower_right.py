import time, torch, torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right
torch.set_num_threads(1)
def bench(fn, n=3):
    fn(); t=[]
    for _ in range(n):
        s=time.perf_counter(); fn(); t.append(time.perf_counter()-s)
    return 1000*sorted(t)[n//2]
for ql, kl in ((2048, 8192), (1500, 1500)):
    q=torch.randn(1,8,ql,32,dtype=torch.bfloat16); k=torch.randn(1,4,kl,32,dtype=torch.bfloat16); v=torch.randn_like(k)
    kr, vr = k.repeat_interleave(2,1), v.repeat_interleave(2,1)
    mask=(torch.arange(kl) <= torch.arange(kl-ql,kl).unsqueeze(-1))[None,None]
    ref = F.scaled_dot_product_attention(q,kr,vr,attn_mask=mask)
    bias = causal_lower_right(ql, kl)
    out = F.scaled_dot_product_attention(q,kr,vr,attn_mask=bias)
    print(ql, kl, "max diff lower_right vs mask", (out.float()-ref.float()).abs().max().item())
    print(" mask %.1f ms; causal_lower_right %.1f ms" % (bench(lambda: F.scaled_dot_product_attention(q,kr,vr,attn_mask=mask)), bench(lambda: F.scaled_dot_product_attention(q,kr,vr,attn_mask=bias))))
