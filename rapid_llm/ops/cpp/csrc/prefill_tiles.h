// What both forms of the tiled prefill kernel share (prefill_attention.cpp, prefill_attention_amx.h): the key
// tile, the work item, the cache element to bf16 conversion and the 16-lane e^x of the online softmax.
#pragma once

#include "paged_attention_bf16.h"

#ifdef RAPID_LLM_HAS_AVX512_BF16_ATTENTION

#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>

#include <cstdint>

namespace prefill_tiles {

constexpr int64_t kKeyTile = 64;  // keys per tile: four fp32 score vectors per row

struct PrefillItem {
  int64_t seq, kv_head, token_begin, token_end;  // seq: index into seq_ids; tokens [token_begin, token_end)
  int64_t num_keys;                              // the keys the item's last token sees (its cost)
};

inline uint16_t to_bf16_bits(const c10::BFloat16& value, float) { return value.x; }

inline uint16_t to_bf16_bits(const c10::Float8_e4m3fn& value, float scale) {
  return c10::BFloat16(static_cast<float>(value) * scale).x;
}

// Cache row `position` of one kv head's K (or V) through the block table.
template <typename C>
inline const C* cache_row(const C* head_base, const int64_t* block_table, const paged_kernels::Layout& L,
                          int64_t position) {
  return head_base + block_table[position / L.block_size] * L.cache_block_stride +
         (position % L.block_size) * L.cache_slot_stride;
}

// e^x for x <= 0 (-inf included), 16 lanes: 2^n * 2^f with 2^f from a degree-5 Taylor series (relative
// error below 3e-6, far under the bf16 rounding the probabilities get) and the exponent applied by scalef.
// Below -87 it gives e^-87 (1.6e-38), the bottom of fp32's normal range: a subnormal (e^-88 was one) would
// cost a microcode assist in every instruction it meets on Intel CPUs (exp2_avx512.h).
inline __m512 exp_of_nonpositive_16(__m512 x) {
  const __m512 y = _mm512_mul_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(1.4426950408889634f));
  const __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(y, n);
  __m512 p = _mm512_set1_ps(1.3333558146428443e-03f);
  for (const float c : {9.618129107628477e-03f, 5.550410866482158e-02f, 2.402265069591007e-01f,
                        6.931471805599453e-01f, 1.0f})
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
  return _mm512_scalef_ps(p, n);
}

}  // namespace prefill_tiles

#endif
