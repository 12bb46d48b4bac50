// A decode step's Llama layers in one call: the C++ form of models/llama_decode_program.py's loop. Each layer is
// the same kernels the Python loop calls through its modules (fused_add_rms_norm, a packed linear, Qwen3's
// per-head norms, rotary_embedding, kv_cache_store, paged_attention, the gated MLP linear), in the same order on
// the same tensors, so the result is bit-identical; what goes is the Python between them (~70 µs a layer on a
// 2-core EPYC: module lookups, the op registry's dispatch, pybind's argument conversion), during which the
// second OpenMP thread spins or sleeps. The caller (models/llama_decode_native.py) checks that every module of
// the model is one this loop mirrors; the decode program calls it for decode steps only (one new token a sequence).
#include <ATen/ATen.h>

#include <optional>
#include <vector>

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
std::vector<at::Tensor> fused_add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                           const at::Tensor& weight, double eps);
std::vector<at::Tensor> rotary_embedding(const at::Tensor& query, const at::Tensor& key,
                                         const at::Tensor& cos, const at::Tensor& sin, int64_t head_dim,
                                         int64_t rotary_dim, bool is_neox_style);
void kv_cache_store(const at::Tensor& key, const at::Tensor& value, at::Tensor& kv_cache,
                    const at::Tensor& slot_mapping);
void paged_attention(at::Tensor output, const at::Tensor& query, const at::Tensor& kv_cache,
                     const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
                     const at::Tensor& block_tables, const at::Tensor& seq_ids, double scale,
                     int64_t sliding_window, double k_scale, double v_scale);
at::Tensor amx_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias);
at::Tensor amx_silu_and_mul_linear(const at::Tensor& x, const at::Tensor& packed,
                                   const c10::optional<at::Tensor>& bias);
at::Tensor avx512_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias);
at::Tensor avx512_silu_and_mul_linear(const at::Tensor& x, const at::Tensor& packed,
                                      const c10::optional<at::Tensor>& bias);

namespace {

// A layer's tensors in `layer_tensors`, in this order; the biases and the q/k norms may be None. kOBias and
// kDownBias are added after their GEMM, the other two inside it, as the modules do.
enum Slot : int64_t { kInputNorm, kQkv, kQkvBias, kQNorm, kKNorm, kO, kOBias, kPostNorm, kGateUp, kGateUpBias,
                      kDown, kDownBias, kKvCache, kSlotsPerLayer };

using Linear = at::Tensor (*)(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&);

// A row-parallel linear's bias is added to its (reduced) output in the model's dtype, not inside the GEMM
// (layers/linear.py, RowParallelLinear.combine): the same rounding here.
at::Tensor plus_bias(const at::Tensor& output, const c10::optional<at::Tensor>& bias) {
  return bias.has_value() ? output + *bias : output;
}

}  // namespace

// hidden [T, H]: the embedded tokens; cos, sin [T, 1, rotary_dim / 2]; the attention metadata as
// paged_attention takes it (seq_ids: every sequence); eps: {input/post norm, q/k norm, final norm};
// heads: {query heads, kv heads, head_dim, rotary_dim}. Returns the final norm of the last layer's output.
at::Tensor llama_decode_layers(const at::Tensor& hidden, const std::vector<c10::optional<at::Tensor>>& layer_tensors,
                               const at::Tensor& final_norm, const at::Tensor& cos, const at::Tensor& sin,
                               const at::Tensor& slot_mapping, const at::Tensor& query_start_loc,
                               const at::Tensor& seq_lens, const at::Tensor& block_tables, const at::Tensor& seq_ids,
                               const std::vector<double>& eps, const std::vector<int64_t>& heads, bool is_neox_style,
                               double scale, int64_t sliding_window, bool amx) {
  TORCH_CHECK(layer_tensors.size() % kSlotsPerLayer == 0 && !layer_tensors.empty(),
              "llama_decode_layers: ", static_cast<int64_t>(kSlotsPerLayer), " tensors a layer expected");
  TORCH_CHECK(eps.size() == 3 && heads.size() == 4, "llama_decode_layers: eps {norm, qk norm, final} and heads "
              "{query heads, kv heads, head_dim, rotary_dim} expected");
  const Linear linear = amx ? amx_linear : avx512_linear;
  const Linear gated_linear = amx ? amx_silu_and_mul_linear : avx512_silu_and_mul_linear;
  const int64_t num_heads = heads[0], num_kv_heads = heads[1], head_dim = heads[2], rotary_dim = heads[3];
  const int64_t q_width = num_heads * head_dim, kv_width = num_kv_heads * head_dim;
  const auto tensor = [&](int64_t layer, Slot slot) -> const at::Tensor& {
    const auto& entry = layer_tensors[layer * kSlotsPerLayer + slot];
    TORCH_CHECK(entry.has_value(), "llama_decode_layers: layer ", layer, " lacks tensor ", static_cast<int64_t>(slot));
    return *entry;
  };
  const auto optional = [&](int64_t layer, Slot slot) -> const c10::optional<at::Tensor>& {
    return layer_tensors[layer * kSlotsPerLayer + slot];
  };
  at::Tensor x = hidden, residual;
  const int64_t num_layers = static_cast<int64_t>(layer_tensors.size()) / kSlotsPerLayer;
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    at::Tensor normed;
    if (layer == 0) {
      residual = x;
      normed = rms_norm(x, tensor(layer, kInputNorm), eps[0]);
    } else {
      auto pair = fused_add_rms_norm(x, residual, tensor(layer, kInputNorm), eps[0]);
      normed = pair[0];
      residual = pair[1];
    }
    const at::Tensor qkv = linear(normed, tensor(layer, kQkv), optional(layer, kQkvBias));
    at::Tensor q = qkv.narrow(1, 0, q_width), k = qkv.narrow(1, q_width, kv_width);
    const at::Tensor v = qkv.narrow(1, q_width + kv_width, kv_width);
    if (optional(layer, kQNorm).has_value()) {
      q = rms_norm(q.reshape({-1, head_dim}), tensor(layer, kQNorm), eps[1]).view(q.sizes());
      k = rms_norm(k.reshape({-1, head_dim}), tensor(layer, kKNorm), eps[1]).view(k.sizes());
    }
    auto rotated = rotary_embedding(q, k, cos, sin, head_dim, rotary_dim, is_neox_style);
    const at::Tensor query = rotated[0].view({-1, num_heads, head_dim});
    at::Tensor kv_cache = tensor(layer, kKvCache);
    kv_cache_store(rotated[1].view({-1, num_kv_heads, head_dim}), v.view({-1, num_kv_heads, head_dim}), kv_cache,
                   slot_mapping);
    at::Tensor attended = at::empty_like(query, at::MemoryFormat::Contiguous);
    paged_attention(attended, query, kv_cache, query_start_loc, seq_lens, block_tables, seq_ids, scale,
                    sliding_window, 1.0, 1.0);
    x = plus_bias(linear(attended.view({-1, q_width}), tensor(layer, kO), c10::nullopt), optional(layer, kOBias));
    auto post = fused_add_rms_norm(x, residual, tensor(layer, kPostNorm), eps[0]);
    residual = post[1];
    const at::Tensor activated = gated_linear(post[0], tensor(layer, kGateUp), optional(layer, kGateUpBias));
    x = plus_bias(linear(activated, tensor(layer, kDown), c10::nullopt), optional(layer, kDownBias));
  }
  return fused_add_rms_norm(x, residual, final_norm, eps[2])[0];
}
