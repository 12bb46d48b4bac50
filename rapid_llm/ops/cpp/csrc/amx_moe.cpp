// fused_moe for the `cpu_amx` and `cpu_avx512` kernels in one call per layer: token slots sorted by expert (a
// counting sort), then per expert that received tokens: gather its rows, the packed linear's gated form with
// w13[e] (silu_and_mul in its epilogue), the packed linear with w2[e] (amx_linear's, or avx512_linear's where
// `amx` is false), and the weighted
// scatter-add into the output. The same steps as the Python loop
// (rapid_llm/ops/moe.py `expert_loop`), whose ~10 ATen calls per expert cost more than the expert's GEMMs
// at decode sizes. Rounding follows it too: the product of a bf16 row and its routing weight (fp32, or bf16
// widened exactly) is an fp32 product rounded to bf16, and each add into the output rounds, in expert order.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros_like.h>

#include "bf16_bits.h"

#include <cstring>
#include <vector>

// out + bf16(a * w) must round the product before the add, as the reference's two ATen ops do.
#pragma GCC optimize("fp-contract=off")

at::Tensor amx_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias);
at::Tensor amx_silu_and_mul_linear(const at::Tensor& x, const at::Tensor& packed,
                                   const c10::optional<at::Tensor>& bias);
at::Tensor avx512_linear(const at::Tensor& x, const at::Tensor& packed,
                         const c10::optional<at::Tensor>& bias);
at::Tensor avx512_silu_and_mul_linear(const at::Tensor& x, const at::Tensor& packed,
                                      const c10::optional<at::Tensor>& bias);

namespace {

// Slot ids (token * top_k + k) grouped by expert in slot order, and where each expert's group starts (E + 1).
void sort_slots(const int64_t* expert_ids, int64_t slots, int64_t experts, std::vector<int64_t>& order,
                std::vector<int64_t>& starts) {
  starts.assign(experts + 1, 0);
  for (int64_t slot = 0; slot < slots; ++slot) {
    TORCH_CHECK(expert_ids[slot] >= 0 && expert_ids[slot] < experts, "packed_fused_moe: expert id ",
                expert_ids[slot], " outside [0, ", experts, ")");
    ++starts[expert_ids[slot] + 1];
  }
  for (int64_t expert = 0; expert < experts; ++expert) starts[expert + 1] += starts[expert];
  std::vector<int64_t> next(starts.begin(), starts.end() - 1);
  order.resize(slots);
  for (int64_t slot = 0; slot < slots; ++slot) order[next[expert_ids[slot]]++] = slot;
}

// target += bf16(source * weight), each add rounded to bf16 (the reference's mul, .to and index_add_).
void add_weighted_row(const uint16_t* source, float weight, uint16_t* target, int64_t n) {
#pragma omp simd
  for (int64_t h = 0; h < n; ++h) {
    const float product = bf16_bits_to_float(float_to_bf16_bits(bf16_bits_to_float(source[h]) * weight));
    target[h] = float_to_bf16_bits(bf16_bits_to_float(target[h]) + product);
  }
}

}  // namespace

at::Tensor packed_fused_moe(const at::Tensor& x, const at::Tensor& topk_weights,
                            const at::Tensor& topk_ids, const at::Tensor& w13, const at::Tensor& w2,
                            bool amx) {
  const auto linear = amx ? amx_linear : avx512_linear;
  const auto gated_linear = amx ? amx_silu_and_mul_linear : avx512_silu_and_mul_linear;
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous() && x.device().is_cpu() &&
                  w13.device().is_cpu() && w2.device().is_cpu() && topk_ids.device().is_cpu() &&
                  topk_weights.device().is_cpu(),
              "packed_fused_moe: x must be contiguous CPU bf16 [tokens, hidden], every input on the CPU");
  TORCH_CHECK(topk_ids.dim() == 2 && topk_ids.size(0) == x.size(0) && topk_ids.scalar_type() == at::kLong &&
                  topk_weights.sizes() == topk_ids.sizes(),
              "packed_fused_moe: topk_ids (int64) and topk_weights must both be [tokens, top_k]");
  TORCH_CHECK(w13.dim() == 4 && w2.dim() == 4 && w13.size(0) == w2.size(0),
              "packed_fused_moe: w13 and w2 must be stacked amx_pack_weight weights [E, N/16, K/2, 32]");
  const int64_t tokens = x.size(0), hidden = x.size(1), top_k = topk_ids.size(1), experts = w13.size(0);
  const auto ids = topk_ids.contiguous();
  const auto weights = topk_weights.to(at::kFloat).contiguous();  // bf16 widens exactly
  std::vector<int64_t> order, starts;
  sort_slots(ids.data_ptr<int64_t>(), tokens * top_k, experts, order, starts);
  auto out = at::zeros_like(x);
  const auto* x_data = x.data_ptr<at::BFloat16>();
  const float* weight_data = weights.data_ptr<float>();
  auto* out_data = out.data_ptr<at::BFloat16>();
  for (int64_t expert = 0; expert < experts; ++expert) {
    const int64_t begin = starts[expert], rows = starts[expert + 1] - begin;
    if (rows == 0) continue;
    auto gathered = at::empty({rows, hidden}, x.options());
    auto* gathered_data = gathered.data_ptr<at::BFloat16>();
    for (int64_t row = 0; row < rows; ++row)
      std::memcpy(gathered_data + row * hidden, x_data + order[begin + row] / top_k * hidden,
                  hidden * sizeof(at::BFloat16));
    const auto down = linear(gated_linear(gathered, w13[expert], c10::nullopt), w2[expert], c10::nullopt);
    const auto* down_data = down.data_ptr<at::BFloat16>();
    TORCH_CHECK(down.size(1) == hidden, "packed_fused_moe: w2 must map back to the hidden width ", hidden);
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t slot = order[begin + row];
      const float weight = weight_data[slot];
      add_weighted_row(reinterpret_cast<const uint16_t*>(down_data + row * hidden), weight,
                       reinterpret_cast<uint16_t*>(out_data + slot / top_k * hidden), hidden);
    }
  }
  return out;
}
