// The Python module of the CPU op extension: binds the kernels of paged_attention.cpp, prefill_attention.cpp,
// fused_elementwise.cpp, kv_cache_store.cpp, amx_linear.cpp, avx512_linear.cpp, amx_moe.cpp, token_bitmask.cpp,
// state_decode.cpp, lora.cpp and decode_layers.cpp (one module, so one build and one load serve every CPU op).
// Only this file includes Python binding headers, and only torch's pybind11 glue (the at::Tensor caster), not
// <torch/extension.h>: that header pulls in the whole C++ frontend (torch::nn, autograd, optimisers), ~20 s
// of compile per file. The kernel files include just the ATen headers they use for the same reason.
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <vector>

void paged_attention(at::Tensor output, const at::Tensor& query, const at::Tensor& kv_cache,
                     const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
                     const at::Tensor& block_tables, const at::Tensor& seq_ids, double scale,
                     int64_t sliding_window, double k_scale, double v_scale);
bool paged_attention_bf16_kernel();
void prefill_attention(at::Tensor output, const at::Tensor& query, const at::Tensor& kv_cache,
                       const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
                       const at::Tensor& block_tables, const at::Tensor& seq_ids, double scale,
                       int64_t sliding_window, double k_scale, double v_scale, bool amx_tiles);
std::vector<int64_t> prefill_attention_head_dims();
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
std::vector<at::Tensor> fused_add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                           const at::Tensor& weight, double eps);
at::Tensor silu_and_mul(const at::Tensor& x);
std::vector<at::Tensor> rotary_embedding(const at::Tensor& query, const at::Tensor& key,
                                         const at::Tensor& cos, const at::Tensor& sin, int64_t head_dim,
                                         int64_t rotary_dim, bool is_neox_style);
void kv_cache_store(const at::Tensor& key, const at::Tensor& value, at::Tensor& kv_cache,
                    const at::Tensor& slot_mapping);
bool amx_linear_supported();
at::Tensor amx_pack_weight(const at::Tensor& weight);
at::Tensor amx_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias);
at::Tensor amx_silu_and_mul_linear(const at::Tensor& x, const at::Tensor& packed,
                                   const c10::optional<at::Tensor>& bias);
bool avx512_linear_supported();
at::Tensor avx512_linear(const at::Tensor& x, const at::Tensor& packed,
                         const c10::optional<at::Tensor>& bias);
at::Tensor avx512_silu_and_mul_linear(const at::Tensor& x, const at::Tensor& packed,
                                      const c10::optional<at::Tensor>& bias);
at::Tensor packed_fused_moe(const at::Tensor& x, const at::Tensor& topk_weights,
                            const at::Tensor& topk_ids, const at::Tensor& w13, const at::Tensor& w2,
                            bool amx);
void apply_token_bitmask(at::Tensor logits, const at::Tensor& bitmask);
at::Tensor ssd_scan_decode(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A, const at::Tensor& B,
                           const at::Tensor& C, const at::Tensor& D, at::Tensor state, const at::Tensor& slots);
at::Tensor gated_delta_rule_decode(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                   const at::Tensor& g, const at::Tensor& beta, at::Tensor state,
                                   const at::Tensor& slots);
void lora(const at::Tensor& x, const at::Tensor& lora_a, const at::Tensor& lora_b, const at::Tensor& slot_starts,
          const at::Tensor& sorted_tokens, at::Tensor out);
std::string lora_kernel();
at::Tensor llama_decode_layers(const at::Tensor& hidden, const std::vector<c10::optional<at::Tensor>>& layer_tensors,
                               const at::Tensor& final_norm, const at::Tensor& cos, const at::Tensor& sin,
                               const at::Tensor& slot_mapping, const at::Tensor& query_start_loc,
                               const at::Tensor& seq_lens, const at::Tensor& block_tables, const at::Tensor& seq_ids,
                               const std::vector<double>& eps, const std::vector<int64_t>& heads, bool is_neox_style,
                               double scale, int64_t sliding_window, bool amx);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("paged_attention", &paged_attention, "Causal attention over the paged KV cache (CPU)");
  module.def("paged_attention_bf16_kernel", &paged_attention_bf16_kernel,
             "Whether paged_attention has its AVX-512 BF16 kernel (bf16 query and cache, head_dim 32/64/128/256)");
  module.def("prefill_attention", &prefill_attention,
             "Tiled causal attention for long prompt chunks over the paged KV cache (CPU, AVX-512 BF16 or AMX)");
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
  module.def("amx_silu_and_mul_linear", &amx_silu_and_mul_linear,
             "silu_and_mul(x W^T + b) over the amx_pack_weight weight of a merged [gate; up] (bf16)");
  module.def("avx512_linear_supported", &avx512_linear_supported,
             "Whether avx512_linear runs here (built for AVX512-BF16)");
  module.def("avx512_linear", &avx512_linear, "x W^T + b over an amx_pack_weight weight, AVX-512 BF16 (bf16)");
  module.def("avx512_silu_and_mul_linear", &avx512_silu_and_mul_linear,
             "silu_and_mul(x W^T + b) over the amx_pack_weight weight of a merged [gate; up], AVX-512 BF16 (bf16)");
  module.def("apply_token_bitmask", &apply_token_bitmask, "-inf into the float32 logits a grammar bitmask forbids");
  module.def("packed_fused_moe", &packed_fused_moe,
             "fused_moe over stacked amx_pack_weight experts (bf16): amx_linear GEMMs, or avx512_linear's");
  module.def("ssd_scan_decode", &ssd_scan_decode, "One Mamba2 scan step per sequence, its state row in place");
  module.def("gated_delta_rule_decode", &gated_delta_rule_decode,
             "One gated delta rule step per sequence, its state row in place");
  module.def("lora", &lora, "Each grouped token's LoRA delta (x A^T) B^T added into its row of out");
  module.def("llama_decode_layers", &llama_decode_layers,
             "A decode step's Llama layers and final norm in one call (packed bf16 linears, paged attention)");
  module.def("lora_kernel", &lora_kernel, "Which lora code this build has: avx512_bf16, avx512 or scalar");
}
