// The Python module of the CPU op extension: binds the kernels of paged_attention.cpp, prefill_attention.cpp,
// fused_elementwise.cpp, kv_cache_store.cpp, amx_linear.cpp, avx512_linear.cpp, amx_moe.cpp and
// token_bitmask.cpp (one module, so one build and one load serve every CPU op).
#include <torch/extension.h>

#include <vector>

void paged_attention(torch::Tensor output, const torch::Tensor& query, const torch::Tensor& kv_cache,
                     const torch::Tensor& query_start_loc, const torch::Tensor& seq_lens,
                     const torch::Tensor& block_tables, const torch::Tensor& seq_ids, double scale,
                     int64_t sliding_window, double k_scale, double v_scale);
bool paged_attention_bf16_kernel();
void prefill_attention(torch::Tensor output, const torch::Tensor& query, const torch::Tensor& kv_cache,
                       const torch::Tensor& query_start_loc, const torch::Tensor& seq_lens,
                       const torch::Tensor& block_tables, const torch::Tensor& seq_ids, double scale,
                       int64_t sliding_window, double k_scale, double v_scale);
std::vector<int64_t> prefill_attention_head_dims();
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
std::vector<torch::Tensor> fused_add_rms_norm(const torch::Tensor& x, const torch::Tensor& residual,
                                              const torch::Tensor& weight, double eps);
torch::Tensor silu_and_mul(const torch::Tensor& x);
std::vector<torch::Tensor> rotary_embedding(const torch::Tensor& query, const torch::Tensor& key,
                                            const torch::Tensor& cos, const torch::Tensor& sin, int64_t head_dim,
                                            int64_t rotary_dim, bool is_neox_style);
void kv_cache_store(const torch::Tensor& key, const torch::Tensor& value, torch::Tensor& kv_cache,
                    const torch::Tensor& slot_mapping);
bool amx_linear_supported();
torch::Tensor amx_pack_weight(const torch::Tensor& weight);
torch::Tensor amx_linear(const torch::Tensor& x, const torch::Tensor& packed, const c10::optional<torch::Tensor>& bias);
bool avx512_linear_supported();
torch::Tensor avx512_linear(const torch::Tensor& x, const torch::Tensor& packed,
                            const c10::optional<torch::Tensor>& bias);
torch::Tensor packed_fused_moe(const torch::Tensor& x, const torch::Tensor& topk_weights,
                              const torch::Tensor& topk_ids, const torch::Tensor& w13, const torch::Tensor& w2,
                              bool amx);
void apply_token_bitmask(torch::Tensor logits, const torch::Tensor& bitmask);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("paged_attention", &paged_attention, "Causal attention over the paged KV cache (CPU)");
  module.def("paged_attention_bf16_kernel", &paged_attention_bf16_kernel,
             "Whether paged_attention has its AVX-512 BF16 kernel (bf16 query and cache, head_dim 32/64/128/256)");
  module.def("prefill_attention", &prefill_attention,
             "Tiled causal attention for long prompt chunks over the paged KV cache (CPU, AVX-512 BF16)");
  module.def("prefill_attention_head_dims", &prefill_attention_head_dims,
             "The head dims prefill_attention computes here (none without AVX-512 BF16)");
  module.def("rms_norm", &rms_norm, "RMSNorm of each row");
  module.def("fused_add_rms_norm", &fused_add_rms_norm, "(rms_norm(x + residual), x + residual)");
  module.def("silu_and_mul", &silu_and_mul, "silu(gate) * up of [rows, 2 * width]");
  module.def("rotary_embedding", &rotary_embedding, "Rotary embedding of query and key rows");
  module.def("kv_cache_store", &kv_cache_store, "New K/V rows into their cache slots");
  module.def("amx_linear_supported", &amx_linear_supported, "Whether amx_linear runs here (AMX built and granted)");
  module.def("amx_pack_weight", &amx_pack_weight, "A bf16 [out, in] weight in amx_linear's layout");
  module.def("amx_linear", &amx_linear, "x W^T + b over an amx_pack_weight weight (bf16)");
  module.def("avx512_linear_supported", &avx512_linear_supported,
             "Whether avx512_linear runs here (built for AVX512-BF16)");
  module.def("avx512_linear", &avx512_linear, "x W^T + b over an amx_pack_weight weight, AVX-512 BF16 (bf16)");
  module.def("apply_token_bitmask", &apply_token_bitmask, "-inf into the float32 logits a grammar bitmask forbids");
  module.def("packed_fused_moe", &packed_fused_moe,
             "fused_moe over stacked amx_pack_weight experts (bf16): amx_linear GEMMs, or avx512_linear's");
}
