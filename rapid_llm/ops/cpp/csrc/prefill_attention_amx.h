// The AMX form of the tiled prefill kernel (prefill_attention.cpp). An item's rows (tokens x group heads) go
// in blocks of 16 that are the columns of every tile product, so the online softmax runs down 16-lane
// vectors, one per key, with no horizontal reduction: scores^T = K . Q^T (16 keys x 32 dims times the block's
// 16 dim pairs x 16 rows), acc^T += V^T . P^T (16 dims x 32 keys times 16 key pairs x 16 rows). fp32
// accumulation; probabilities rounded to bf16 (as GPU flash attention rounds them to the input dtype). Its
// packed tiles: K as rows of keys ([64][D] bf16), V transposed ([D][64] bf16). Every tile is 16 rows x 64
// bytes, so one configuration serves all. Head dims that are multiples of 32 take this form.
#pragma once

#include "amx_tiles.h"
#include "exp2_avx512.h"
#include "prefill_tiles.h"

#ifdef RAPID_LLM_HAS_AMX

#include <algorithm>
#include <limits>
#include <vector>

namespace prefill_amx {

using paged_kernels::Layout;
using prefill_tiles::kKeyTile;

constexpr int64_t kLanes = 16;  // rows of a block: one fp32 vector, the columns of every tile

inline void configure_tiles() {
  amx_tiles::TileConfig config;
  for (int tile = 0; tile < 8; ++tile) {
    config.rows[tile] = kLanes;
    config.bytes_per_row[tile] = 64;
  }
  _tile_loadconfig(&config);
}

// Keys [first, first + count) of a kv head, a row each: packed[j * D + d]; rows past `count` are zero.
template <typename C, int D>
void pack_key_rows(const C* keys, const int64_t* block_table, const Layout& L, int64_t first, int64_t count,
                   float scale, uint16_t* packed) {
  std::fill(packed, packed + kKeyTile * D, uint16_t{0});
  for (int64_t j = 0; j < count; ++j) {
    const C* row = prefill_tiles::cache_row(keys, block_table, L, first + j);
    for (int d = 0; d < D; ++d) packed[j * D + d] = prefill_tiles::to_bf16_bits(row[d], scale);
  }
}

// Values [first, first + count) transposed: packed[d * 64 + j]; keys past `count` are zero.
template <typename C, int D>
void pack_value_columns(const C* values, const int64_t* block_table, const Layout& L, int64_t first,
                        int64_t count, float scale, uint16_t* packed) {
  std::fill(packed, packed + kKeyTile * D, uint16_t{0});
  for (int64_t j = 0; j < count; ++j) {
    const C* row = prefill_tiles::cache_row(values, block_table, L, first + j);
    for (int d = 0; d < D; ++d) packed[d * kKeyTile + j] = prefill_tiles::to_bf16_bits(row[d], scale);
  }
}

// scores[k * 16 + lane] = key k . the block's query `lane`, for the tile's 64 keys; query_pairs[p * 16 + lane]
// holds the query's dims 2p and 2p + 1.
template <int D>
inline void score_columns(const uint16_t* keys, const uint32_t* query_pairs, float* scores) {
  static_assert(D % 32 == 0, "a key tile row holds 32 dims");
  constexpr int key_stride = D * 2;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int d = 0; d < D; d += 32) {
    _tile_loadd(4, query_pairs + (d / 2) * kLanes, 64);
    _tile_loadd(5, keys + d, key_stride);
    _tile_loadd(6, keys + 16 * D + d, key_stride);
    _tile_dpbf16ps(0, 5, 4);
    _tile_dpbf16ps(1, 6, 4);
    _tile_loadd(7, keys + 32 * D + d, key_stride);
    _tile_loadd(5, keys + 48 * D + d, key_stride);
    _tile_dpbf16ps(2, 7, 4);
    _tile_dpbf16ps(3, 5, 4);
  }
  _tile_stored(0, scores, 64);
  _tile_stored(1, scores + 16 * kLanes, 64);
  _tile_stored(2, scores + 32 * kLanes, 64);
  _tile_stored(3, scores + 48 * kLanes, 64);
}

// acc[d * 16 + lane] += sum over the tile's keys of p[key][lane] * v_key[d], over `halves` (1 or 2) runs of 32
// keys; probabilities[i * 16 + lane] holds the lane's bf16 probabilities of keys 2i and 2i + 1.
template <int D>
inline void accumulate_columns(const uint16_t* values, const uint32_t* probabilities, int halves, float* acc) {
  static_assert(D % 32 == 0, "the accumulator is added to 32 or 64 dims at a time");
  constexpr int value_stride = kKeyTile * 2;
  for (int d = 0; d < D; d += 64) {
    const bool four = D - d >= 64;
    float* out = acc + d * kLanes;
    _tile_loadd(0, out, 64);
    _tile_loadd(1, out + 16 * kLanes, 64);
    if (four) {
      _tile_loadd(2, out + 32 * kLanes, 64);
      _tile_loadd(3, out + 48 * kLanes, 64);
    }
    for (int half = 0; half < halves; ++half) {
      const uint16_t* v = values + d * kKeyTile + 32 * half;
      _tile_loadd(4, probabilities + 16 * half * kLanes, 64);
      _tile_loadd(5, v, value_stride);
      _tile_loadd(6, v + 16 * kKeyTile, value_stride);
      _tile_dpbf16ps(0, 5, 4);
      _tile_dpbf16ps(1, 6, 4);
      if (four) {
        _tile_loadd(7, v + 32 * kKeyTile, value_stride);
        _tile_loadd(5, v + 48 * kKeyTile, value_stride);
        _tile_dpbf16ps(2, 7, 4);
        _tile_dpbf16ps(3, 5, 4);
      }
    }
    _tile_stored(0, out, 64);
    _tile_stored(1, out + 16 * kLanes, 64);
    if (four) {
      _tile_stored(2, out + 32 * kLanes, 64);
      _tile_stored(3, out + 48 * kLanes, 64);
    }
  }
}

// probabilities[i * 16 + lane] = the bf16 pair of 2^(s c - max_c) for keys 2i and 2i + 1 of a tile's dot products
// (scores[k * 16 + lane]), 0 where `keep` (when given) drops a key; returns the lanes' sums of the fp32 weights.
inline __m512 weigh_tile(const float* scores, __m512 c, __m512 max_c, const __mmask16* keep, uint32_t* probabilities) {
  alignas(64) static constexpr int16_t kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                          8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i interleave = _mm512_load_si512(kInterleave);
  __m512 sums[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int i = 0; i < kKeyTile / 2; ++i) {
    __m512 even = exp2_16<3>(_mm512_fmsub_ps(_mm512_load_ps(scores + 2 * i * kLanes), c, max_c));
    __m512 odd = exp2_16<3>(_mm512_fmsub_ps(_mm512_load_ps(scores + (2 * i + 1) * kLanes), c, max_c));
    if (keep != nullptr) {
      even = _mm512_maskz_mov_ps(keep[2 * i], even);
      odd = _mm512_maskz_mov_ps(keep[2 * i + 1], odd);
    }
    sums[0] = _mm512_add_ps(sums[0], even);
    sums[1] = _mm512_add_ps(sums[1], odd);
    const __m512i pair = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(odd, even));  // even keys low, odd high
    _mm512_store_si512(probabilities + i * kLanes, _mm512_permutexvar_epi16(interleave, pair));
  }
  return _mm512_add_ps(sums[0], sums[1]);
}

// One block's dot products for a key tile (scores[k * 16 + lane], keys from key_first) become bf16
// probability pairs (weigh_tile); its running max (of unscaled dot products: the scale is positive) and sums
// move on, and where a lane's max rose, its sum and accumulator column are rescaled. e^(scale (s - max)) is
// 2^(s c - max c) with c = scale log2(e): one fused multiply-subtract. An unmasked tile is first weighed
// against the running max, with no pass for its own: weights above 1 are harmless far from fp32's range
// (sums up to 2^32 a tile), so the tile is weighed again against its true max only when a lane's sum passes
// that or is not finite (a lane's first keys: max -inf). When `masked`, a lane keeps only keys that exist
// (below key_first + count), are not after its position and are inside its window (window > 0); the others get
// probability 0.
template <int D>
inline void softmax_columns(const float* scores, float scale, int64_t key_first, int64_t count,
                            const int32_t* positions, int64_t window, bool masked, float* running_max,
                            float* running_sum, float* acc, uint32_t* probabilities) {
  const __m512 c = _mm512_set1_ps(scale * 1.4426950408889634f);
  const __m512 old_max = _mm512_loadu_ps(running_max);
  __m512 sum = _mm512_loadu_ps(running_sum);
  if (!masked) {
    const __m512 tile_sum = weigh_tile(scores, c, _mm512_mul_ps(old_max, c), nullptr, probabilities);
    if (_mm512_cmp_ps_mask(tile_sum, _mm512_set1_ps(4294967296.0f), _CMP_NLE_UQ) == 0) {
      _mm512_storeu_ps(running_sum, _mm512_add_ps(sum, tile_sum));
      return;
    }
  }
  const __m512 minus_infinity = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 maxima[4] = {minus_infinity, minus_infinity, minus_infinity, minus_infinity};
  __mmask16 keep[kKeyTile];
  if (masked) {
    const __m512i position = _mm512_loadu_si512(positions);
    const __m512i last_key = _mm512_min_epi32(position, _mm512_set1_epi32(static_cast<int>(key_first + count - 1)));
    const __m512i before_window =
        window > 0 ? _mm512_sub_epi32(position, _mm512_set1_epi32(static_cast<int>(std::min<int64_t>(window, 1 << 30))))
                   : _mm512_set1_epi32(std::numeric_limits<int32_t>::min());
    for (int k = 0; k < kKeyTile; k += 4)
      for (int u = 0; u < 4; ++u) {
        const __m512i key = _mm512_set1_epi32(static_cast<int>(key_first + k + u));
        keep[k + u] = _mm512_cmple_epi32_mask(key, last_key) & _mm512_cmpgt_epi32_mask(key, before_window);
        maxima[u] = _mm512_mask_max_ps(maxima[u], keep[k + u], maxima[u], _mm512_load_ps(scores + (k + u) * kLanes));
      }
  } else {
    for (int k = 0; k < kKeyTile; k += 4)
      for (int u = 0; u < 4; ++u) maxima[u] = _mm512_max_ps(maxima[u], _mm512_load_ps(scores + (k + u) * kLanes));
  }
  const __m512 new_max = _mm512_max_ps(old_max, _mm512_max_ps(_mm512_max_ps(maxima[0], maxima[1]),
                                                              _mm512_max_ps(maxima[2], maxima[3])));
  // Lanes with no kept key yet (max -inf) compute garbage that their masks zero.
  const __m512 tile_sum = weigh_tile(scores, c, _mm512_mul_ps(new_max, c), masked ? keep : nullptr, probabilities);
  const __mmask16 rose = _mm512_cmp_ps_mask(new_max, old_max, _CMP_NEQ_UQ);
  if (rose) {
    // Lanes whose max held multiply by 1 (their difference may be -inf - -inf); the others by e^(old - new).
    const __m512 correction = _mm512_mask_blend_ps(
        rose, _mm512_set1_ps(1.0f),
        prefill_tiles::exp_of_nonpositive_16(_mm512_mul_ps(_mm512_sub_ps(old_max, new_max), _mm512_set1_ps(scale))));
    sum = _mm512_mul_ps(sum, correction);
    for (int d = 0; d < D; ++d)
      _mm512_storeu_ps(acc + d * kLanes, _mm512_mul_ps(correction, _mm512_loadu_ps(acc + d * kLanes)));
  }
  _mm512_storeu_ps(running_sum, _mm512_add_ps(sum, tile_sum));
  _mm512_storeu_ps(running_max, new_max);
}

struct Scratch {
  std::vector<uint32_t> query_pairs;  // per block [D/2][16]: the rows' dim pairs (zero in padding lanes)
  std::vector<int32_t> positions;     // per block [16]: the rows' positions (padding lanes repeat the last row's)
  std::vector<float> running_max, running_sum;  // per block [16]
  std::vector<float> acc;                       // per block [D][16]
  alignas(64) float scores[kKeyTile * kLanes];
  alignas(64) uint32_t probabilities[kKeyTile / 2 * kLanes];
};

// One item over the packed tiles of its (sequence, kv head): tile t's keys at packed + t * 2 * 64 * D, its
// values transposed right after them. Rows are written to out as bf16.
template <int D>
void attend_item(const prefill_tiles::PrefillItem& item, const Layout& L, const c10::BFloat16* query,
                 const uint16_t* packed, int64_t seq_len, int64_t query_end, float scale, int64_t window,
                 c10::BFloat16* out, Scratch& s) {
  const int64_t G = L.group, M = (item.token_end - item.token_begin) * G, blocks = (M + kLanes - 1) / kLanes;
  s.query_pairs.assign(blocks * (D / 2) * kLanes, 0u);
  s.positions.resize(blocks * kLanes);
  s.running_max.assign(blocks * kLanes, -std::numeric_limits<float>::infinity());
  s.running_sum.assign(blocks * kLanes, 0.0f);
  s.acc.assign(blocks * D * kLanes, 0.0f);
  for (int64_t r = 0; r < blocks * kLanes; ++r) {
    const int64_t row = std::min(r, M - 1), token = item.token_begin + row / G;
    s.positions[r] = static_cast<int32_t>(seq_len - (query_end - token));
    if (r != row) continue;
    const uint32_t* q = reinterpret_cast<const uint32_t*>(query + token * L.q_token_stride +
                                                          (item.kv_head * G + row % G) * L.q_head_stride);
    uint32_t* dst = s.query_pairs.data() + (r / kLanes) * (D / 2) * kLanes + r % kLanes;
    for (int p = 0; p < D / 2; ++p) dst[p * kLanes] = q[p];
  }
  const int64_t first_position = s.positions[0], last_position = s.positions[M - 1];
  const int64_t key_end = last_position + 1;
  const int64_t key_begin = window > 0 ? std::max<int64_t>(0, first_position - window + 1) : 0;
  for (int64_t tile = key_begin / kKeyTile; tile * kKeyTile < key_end; ++tile) {
    const int64_t first = tile * kKeyTile, count = std::min(kKeyTile, key_end - first);
    const uint16_t* keys = packed + tile * 2 * kKeyTile * D;
    const int halves = count > kKeyTile / 2 ? 2 : 1;
    for (int64_t b = 0; b < blocks; ++b) {
      // Positions rise along a block's lanes.
      const int64_t low = s.positions[b * kLanes], high = s.positions[b * kLanes + kLanes - 1];
      if (first > high || (window > 0 && first + count - 1 < low - window + 1)) continue;  // no lane sees a key
      const bool masked = count < kKeyTile || first + count - 1 > low || (window > 0 && first < high - window + 1);
      score_columns<D>(keys, s.query_pairs.data() + b * (D / 2) * kLanes, s.scores);
      softmax_columns<D>(s.scores, scale, first, count, s.positions.data() + b * kLanes, window, masked,
                         s.running_max.data() + b * kLanes, s.running_sum.data() + b * kLanes,
                         s.acc.data() + b * D * kLanes, s.probabilities);
      accumulate_columns<D>(keys + kKeyTile * D, s.probabilities, halves, s.acc.data() + b * D * kLanes);
    }
  }
  for (int64_t r = 0; r < M; ++r) {
    const int64_t token = item.token_begin + r / G;
    c10::BFloat16* dst = out + (token * L.num_heads + item.kv_head * G + r % G) * D;
    const float* column = s.acc.data() + (r / kLanes) * D * kLanes + r % kLanes;
    const float inverse = 1.0f / s.running_sum[r];
    for (int d = 0; d < D; ++d) dst[d] = c10::BFloat16(column[d * kLanes] * inverse);
  }
}

}  // namespace prefill_amx

#endif
