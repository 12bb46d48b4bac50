// AMX tile forms of the tiled prefill kernel's two products (prefill_attention.cpp), over blocks of 16 query
// rows copied contiguous (zero rows pad the last block). Every tile is 16 rows x 64 bytes, so one
// configuration serves both: scores are four 16 x 16 fp32 C tiles per 64-key tile, from query tiles of 32
// dims and key tiles of 16 dim pairs x 16 keys (a column block of the packed K tile, read with its row
// stride); P.V adds probability tiles (16 rows x 32 keys) times value tiles (16 key pairs x 16 dims) into the
// fp32 accumulator, loaded and stored 64 dims at a time. The AVX-512 form's packed layouts serve unchanged;
// only head dims that are multiples of 32 take this form.
#pragma once

#include "amx_tiles.h"

#ifdef RAPID_LLM_HAS_AMX

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>

namespace prefill_amx {

constexpr int64_t kBlockRows = 16;

inline void configure_tiles() {
  amx_tiles::TileConfig config;
  for (int tile = 0; tile < 8; ++tile) {
    config.rows[tile] = kBlockRows;
    config.bytes_per_row[tile] = 64;
  }
  _tile_loadconfig(&config);
}

// scores[r][0, KEYS) = q_r . k_j for 16 rows of `queries` (D bf16 each); packed_keys[p * KEYS + j] holds
// key j's dims 2p and 2p + 1. KEYS is 64: four C tiles.
template <int D, int64_t KEYS>
inline void score_block(const c10::BFloat16* queries, const uint32_t* packed_keys, float* scores) {
  static_assert(D % 32 == 0 && KEYS == 64, "the tiles hold 32 dims and 4 x 16 keys");
  constexpr int key_stride = KEYS * 4, query_stride = D * 2;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int p = 0; p < D / 2; p += 16) {
    const uint32_t* keys = packed_keys + p * KEYS;
    _tile_loadd(4, queries + 2 * p, query_stride);
    _tile_loadd(5, keys, key_stride);
    _tile_loadd(6, keys + 16, key_stride);
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 6);
    _tile_loadd(7, keys + 32, key_stride);
    _tile_loadd(5, keys + 48, key_stride);
    _tile_dpbf16ps(2, 4, 7);
    _tile_dpbf16ps(3, 4, 5);
  }
  _tile_stored(0, scores, key_stride);
  _tile_stored(1, scores + 16, key_stride);
  _tile_stored(2, scores + 32, key_stride);
  _tile_stored(3, scores + 48, key_stride);
}

// acc[r][0, D) += P_r . V for 16 rows over `halves` (1 or 2) runs of 16 key pairs: probabilities hold
// PAIRS bf16 pairs a row, packed_values[i * D + d] holds (v_2i[d], v_2i+1[d]).
template <int D, int64_t PAIRS>
inline void accumulate_block(const uint32_t* probabilities, const uint32_t* packed_values, int halves, float* acc) {
  static_assert(D % 32 == 0, "the accumulator is added to 32 or 64 dims at a time");
  constexpr int acc_stride = D * 4, probability_stride = PAIRS * 4, value_stride = D * 4;
  for (int d = 0; d < D; d += 64) {
    const bool four = D - d >= 64;
    _tile_loadd(0, acc + d, acc_stride);
    _tile_loadd(1, acc + d + 16, acc_stride);
    if (four) {
      _tile_loadd(2, acc + d + 32, acc_stride);
      _tile_loadd(3, acc + d + 48, acc_stride);
    }
    for (int half = 0; half < halves; ++half) {
      const uint32_t* values = packed_values + 16 * half * D + d;
      _tile_loadd(4, probabilities + 16 * half, probability_stride);
      _tile_loadd(5, values, value_stride);
      _tile_loadd(6, values + 16, value_stride);
      _tile_dpbf16ps(0, 4, 5);
      _tile_dpbf16ps(1, 4, 6);
      if (four) {
        _tile_loadd(7, values + 32, value_stride);
        _tile_loadd(5, values + 48, value_stride);
        _tile_dpbf16ps(2, 4, 7);
        _tile_dpbf16ps(3, 4, 5);
      }
    }
    _tile_stored(0, acc + d, acc_stride);
    _tile_stored(1, acc + d + 16, acc_stride);
    if (four) {
      _tile_stored(2, acc + d + 32, acc_stride);
      _tile_stored(3, acc + d + 48, acc_stride);
    }
  }
}

}  // namespace prefill_amx

#endif
