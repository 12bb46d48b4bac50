// Neox-style rotary embedding for bf16 rows on AVX-512 BF16 CPUs, 16 pairs a step in fp32: each pair
// (x1, x2) = (x[i], x[i + half]) becomes (x1 cos - x2 sin, x2 cos + x1 sin) with every product and the sum
// rounded to bf16 where torch_ref rounds them (as the scalar form in fused_elementwise.cpp does at 8 lanes), so
// results equal torch_ref's bit for bit. Dims past rotary_dim pass through unchanged.
#pragma once

#include "bf16_avx512.h"

#ifdef RAPID_LLM_HAS_BF16_AVX512
#define RAPID_LLM_HAS_ROTARY_BF16 1

#include <cstdint>
#include <cstring>

namespace rotary_bf16 {

// One row of `heads` heads of head_dim values; cos and sin hold rotary_dim / 2 values. bf16 values as their bits.
inline void rotate_neox_row(const uint16_t* x, const uint16_t* cos, const uint16_t* sin, uint16_t* out,
                            int64_t heads, int64_t head_dim, int64_t rotary_dim) {
  using namespace bf16_avx512;
  const int64_t half = rotary_dim / 2;
  for (int64_t head = 0; head < heads; ++head) {
    const uint16_t* h = x + head * head_dim;
    uint16_t* o = out + head * head_dim;
    for (int64_t i = 0; i < half; i += 16) {
      const __mmask16 lanes = tail_lanes(half - i);
      const __m512 c = load_16(cos + i, lanes), s = load_16(sin + i, lanes);
      const __m512 x1 = load_16(h + i, lanes), x2 = load_16(h + half + i, lanes);
      store_16(o + i, lanes, _mm512_sub_ps(round_16(_mm512_mul_ps(x1, c)), round_16(_mm512_mul_ps(x2, s))));
      store_16(o + half + i, lanes, _mm512_add_ps(round_16(_mm512_mul_ps(x2, c)), round_16(_mm512_mul_ps(x1, s))));
    }
    if (rotary_dim < head_dim) std::memcpy(o + rotary_dim, h + rotary_dim, (head_dim - rotary_dim) * sizeof(uint16_t));
  }
}

}  // namespace rotary_bf16

#endif
