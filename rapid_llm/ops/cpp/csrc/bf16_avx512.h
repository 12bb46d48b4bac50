// 16 bf16 values <-> 16 fp32 lanes on AVX-512 BF16 CPUs (masked for a row's tail): widening is exact, narrowing
// rounds to nearest even as torch does. Shared by the explicit bf16 row kernels (silu_bf16.h, rms_norm_bf16.h).
#pragma once

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512VL__)
#define RAPID_LLM_HAS_BF16_AVX512 1

#include <immintrin.h>

#include <cstdint>

namespace bf16_avx512 {

// Lanes [0, min(16, n)) of a row with n values left.
inline __mmask16 tail_lanes(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
}

inline __m512 load_16(const uint16_t* src, __mmask16 lanes) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes, src)), 16));
}

inline __m256i narrow_16(__m512 values) { return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(values)); }

inline void store_16(uint16_t* dst, __mmask16 lanes, __m512 values) {
  _mm256_mask_storeu_epi16(dst, lanes, narrow_16(values));
}

// values rounded to bf16 and widened back: where a bf16 ATen op of the reference rounds its result.
inline __m512 round_16(__m512 values) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(narrow_16(values)), 16));
}

}  // namespace bf16_avx512

#endif
