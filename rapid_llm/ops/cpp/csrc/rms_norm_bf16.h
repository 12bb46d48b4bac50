// rms_norm and fused_add_rms_norm for bf16 rows on AVX-512 BF16 CPUs, 16 lanes a step in fp32, rounded to bf16
// where torch_ref rounds (the sum x + residual, the normalised row, its product with the weight), as the scalar
// form (fused_elementwise.cpp) does at 8 lanes with bit operations. Squares are rounded before they are added
// (no fused multiply-add, as the reference's pow then mean), in 16 lane sums totalled at the end: another order
// than torch's, so a value can differ from torch_ref's by its last bf16 bit.
#pragma once

#include "bf16_avx512.h"

#ifdef RAPID_LLM_HAS_BF16_AVX512
#define RAPID_LLM_HAS_RMS_NORM_BF16 1

#include <cmath>
#include <cstdint>

namespace rms_norm_bf16 {

// out = bf16(weight * bf16(row / rms(row))); bf16 values as their bits.
inline void normalize_row(const uint16_t* row, const uint16_t* weight, uint16_t* out, int64_t hidden, float eps) {
  using namespace bf16_avx512;
  __m512 squares = _mm512_setzero_ps();
  for (int64_t i = 0; i < hidden; i += 16) {
    const __m512 value = load_16(row + i, tail_lanes(hidden - i));
    squares = _mm512_add_ps(squares, _mm512_mul_ps(value, value));
  }
  const float sum = _mm512_reduce_add_ps(squares);
  const __m512 inverse = _mm512_set1_ps(1.0f / std::sqrt(sum / static_cast<float>(hidden) + eps));
  for (int64_t i = 0; i < hidden; i += 16) {
    const __mmask16 lanes = tail_lanes(hidden - i);
    const __m512 normalized = round_16(_mm512_mul_ps(load_16(row + i, lanes), inverse));
    store_16(out + i, lanes, _mm512_mul_ps(normalized, load_16(weight + i, lanes)));
  }
}

// summed = bf16(x + residual), then out = normalize_row(summed).
inline void add_normalize_row(const uint16_t* x, const uint16_t* residual, const uint16_t* weight, uint16_t* summed,
                              uint16_t* out, int64_t hidden, float eps) {
  using namespace bf16_avx512;
  for (int64_t i = 0; i < hidden; i += 16) {
    const __mmask16 lanes = tail_lanes(hidden - i);
    store_16(summed + i, lanes, _mm512_add_ps(load_16(x + i, lanes), load_16(residual + i, lanes)));
  }
  normalize_row(summed, weight, out, hidden, eps);
}

}  // namespace rms_norm_bf16

#endif
