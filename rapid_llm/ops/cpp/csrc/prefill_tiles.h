// What both forms of the tiled prefill kernel share (prefill_attention.cpp, prefill_attention_amx.h): the key
// tile, the work item, the cache element to bf16 conversion and the 16-lane e^x of the online softmax.
#pragma once

#include "exp2_avx512.h"
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

// e^x for x <= 0 (-inf included), 16 lanes: exp2_avx512.h's 2^y (degree 5) after a clamp at -88, so -inf
// gives about 6e-39, a subnormal, which the bf16 conversion of the probabilities flushes to 0.
inline __m512 exp_of_nonpositive_16(__m512 x) {
  return exp2_16<5>(_mm512_mul_ps(_mm512_max_ps(x, _mm512_set1_ps(-88.0f)), _mm512_set1_ps(1.4426950408889634f)));
}

}  // namespace prefill_tiles

#endif
