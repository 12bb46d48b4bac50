// silu(gate) * up for bf16 rows on AVX-512 BF16 CPUs, 16 lanes a step in fp32, rounded to bf16 where the
// reference rounds (silu's result, then the product). The scalar form (fused_elementwise.cpp) is compiled
// without fused multiply-adds, and its degree-7 e^x with selects ran at 8 lanes; here e^-x comes from
// exp2_avx512.h, then a true division. On random inputs its results equal torch_ref's bit for bit
// (tests/kernels/test_cpu_bf16_rows.py).
#pragma once

#include "bf16_avx512.h"
#include "exp2_avx512.h"

#ifdef RAPID_LLM_HAS_BF16_AVX512
#define RAPID_LLM_HAS_SILU_BF16 1

namespace silu_bf16 {

// x / (1 + e^-x): -0 once e^-x overflows, NaN at -inf, as torch computes it.
inline __m512 silu_16(__m512 x) {
  const __m512 exp_minus_x = exp2_16<5>(_mm512_mul_ps(x, _mm512_set1_ps(-1.4426950408889634f)));
  return _mm512_div_ps(x, _mm512_add_ps(exp_minus_x, _mm512_set1_ps(1.0f)));
}

// out[i] = bf16(bf16(silu(gate[i])) * up[i]) for i < width; bf16 values as their bits.
inline void silu_and_mul_row(const uint16_t* gate, const uint16_t* up, uint16_t* out, int64_t width) {
  using namespace bf16_avx512;
  for (int64_t i = 0; i < width; i += 16) {
    const __mmask16 lanes = tail_lanes(width - i);
    const __m512 rounded_silu = round_16(silu_16(load_16(gate + i, lanes)));
    store_16(out + i, lanes, _mm512_mul_ps(rounded_silu, load_16(up + i, lanes)));
  }
}

}  // namespace silu_bf16

#endif
