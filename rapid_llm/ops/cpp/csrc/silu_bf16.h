// silu(gate) * up for bf16 rows on AVX-512 BF16 CPUs, 16 lanes a step in fp32, rounded to bf16 where the
// reference rounds (silu's result, then the product). The scalar form (fused_elementwise.cpp) is compiled
// without fused multiply-adds, and its degree-7 e^x with selects ran at 8 lanes; here e^-x comes from
// exp2_avx512.h, then a true division. On random inputs its results equal torch_ref's bit for bit
// (tests/kernels/test_silu_bf16.py).
#pragma once

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512VL__)
#define RAPID_LLM_HAS_SILU_BF16 1

#include <immintrin.h>

#include <cstdint>

#include "exp2_avx512.h"

namespace silu_bf16 {

inline __m512 widen_16(__m256i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

inline __m256i narrow_16(__m512 values) { return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(values)); }

// x / (1 + e^-x): -0 once e^-x overflows, NaN at -inf, as torch computes it.
inline __m512 silu_16(__m512 x) {
  const __m512 exp_minus_x = exp2_16<5>(_mm512_mul_ps(x, _mm512_set1_ps(-1.4426950408889634f)));
  return _mm512_div_ps(x, _mm512_add_ps(exp_minus_x, _mm512_set1_ps(1.0f)));
}

// out[i] = bf16(bf16(silu(gate[i])) * up[i]) for i < width; bf16 values as their bits.
inline void silu_and_mul_row(const uint16_t* gate, const uint16_t* up, uint16_t* out, int64_t width) {
  for (int64_t i = 0; i < width; i += 16) {
    const __mmask16 lanes = width - i >= 16 ? static_cast<__mmask16>(0xFFFF)
                                            : static_cast<__mmask16>((1u << (width - i)) - 1u);
    const __m512 g = widen_16(_mm256_maskz_loadu_epi16(lanes, gate + i));
    const __m512 u = widen_16(_mm256_maskz_loadu_epi16(lanes, up + i));
    const __m512 rounded_silu = widen_16(narrow_16(silu_16(g)));
    _mm256_mask_storeu_epi16(out + i, lanes, narrow_16(_mm512_mul_ps(rounded_silu, u)));
  }
}

}  // namespace silu_bf16

#endif
