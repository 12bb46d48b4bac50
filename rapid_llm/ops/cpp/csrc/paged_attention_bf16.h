// The item kernel of paged_attention.cpp for a bf16 query and bf16 cache on AVX-512 BF16 CPUs, with
// head_dim a multiple of 32. A key's dot product with a query head is one AVX-512 BF16 instruction per 32
// dims, which leaves 16 partial sums; the partial vectors of 16 keys are totalled lane-wise by one
// transpose-and-add tree (45 instructions for 16 scores), and the softmax takes one max per chunk of 256 keys
// (one rescale of the accumulator per chunk). P.V is AVX-512 BF16 dot products too: the
// probabilities are rounded to bf16 (as flash attention does on GPUs), two value rows are interleaved so
// one instruction adds p_j v_j + p_j+1 v_j+1 for 16 dims, into a head's accumulator held in registers
// across a chunk of 256 keys (up to head_dim 128; at 256 the compiler spills some of it), while the next
// chunk's K/V lines are prefetched into L2 a few per run of 16 keys. Scores are
// scaled after the dot product (the generic kernel scales the query first), so results differ from it by
// rounding only.
#pragma once

#include "paged_attention.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define RAPID_LLM_HAS_AVX512_BF16_ATTENTION 1

#include <immintrin.h>

#include <algorithm>
#include <limits>

namespace paged_kernels {

constexpr int64_t kKeysPerRun = 16;  // one score per lane of an fp32 vector
constexpr int64_t kKeysPerChunk = 256;  // one kv head's K and V rows of 256 keys: 32-256 KiB at head_dim 32-256

// Lane i of the result is the sum of all 16 lanes of v[i]; v is overwritten.
inline __m512 lane_totals(__m512 v[16]) {
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3]
    v[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: four vectors' sums of that lane
    const __m512d a = _mm512_castps_pd(v[2 * i]), b = _mm512_castps_pd(v[2 * i + 1]);
    v[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  for (int i = 0; i < 2; ++i)  // sum 128-bit lane pairs
    v[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(v[0], v[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// exp_poly.h's e^x, 16 lanes at a time: same polynomial, limits and NaN handling.
inline __m512 exp_poly_16(__m512 x) {
  const __m512 clamped = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 y = _mm512_mul_ps(clamped, _mm512_set1_ps(1.4426950408889634f));
  const __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(y, n);
  __m512 p = _mm512_set1_ps(1.525273380405984e-05f);
  for (const float c : {1.5403530393381606e-04f, 1.3333558146428443e-03f, 9.618129107628477e-03f,
                        5.550410866482158e-02f, 2.402265069591007e-01f, 6.931471805599453e-01f, 1.0f})
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  __m512 value = _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
  value = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33654f), _CMP_LT_OQ), value,
                               _mm512_setzero_ps());
  value = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(88.72283f), _CMP_GT_OQ), value,
                               _mm512_set1_ps(std::numeric_limits<float>::infinity()));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), value, x);
}

inline __m512bh load_bf16_pairs(const c10::BFloat16* src) {
  return reinterpret_cast<__m512bh>(_mm512_loadu_si512(src));
}

// The next chunk's K and V lines (every kv head's, slot by slot in memory order) fetched into L2 a few at a
// time, spread evenly over the current chunk's runs. Without it the first head to touch a chunk waits on
// memory at each new 4 KiB page (a slot's rows of one head are 64-256 bytes apart, too few per page for the
// hardware prefetcher to get ahead), so memory time and compute time added up instead of overlapping.
class ChunkPrefetcher {
 public:
  ChunkPrefetcher(const Layout& L, const c10::BFloat16* cache)
      : cache_(reinterpret_cast<const char*>(cache)),
        kv_bytes_(L.cache_kv_stride * static_cast<int64_t>(sizeof(c10::BFloat16))),
        slot_lines_((L.num_kv_heads * L.cache_head_stride * static_cast<int64_t>(sizeof(c10::BFloat16)) + 63) / 64) {}

  // Spread `count` slots at element offsets `rows` over `calls` calls of step().
  void start(const int64_t* rows, int64_t count, int64_t calls) {
    rows_ = rows, count_ = count, slot_ = 0, line_ = 0;
    per_call_ = (count * 2 * slot_lines_ + calls - 1) / std::max<int64_t>(calls, 1);
  }

  void step() {
    for (int64_t k = 0; k < per_call_ && slot_ < count_; ++k) {
      const char* row = cache_ + rows_[slot_] * static_cast<int64_t>(sizeof(c10::BFloat16));
      const int64_t line = line_ < slot_lines_ ? line_ : line_ - slot_lines_;  // K's lines, then V's
      _mm_prefetch(row + (line_ < slot_lines_ ? 0 : kv_bytes_) + 64 * line, _MM_HINT_T1);
      if (++line_ == 2 * slot_lines_) line_ = 0, ++slot_;
    }
  }

 private:
  const char* cache_;
  int64_t kv_bytes_, slot_lines_;
  const int64_t* rows_ = nullptr;
  int64_t count_ = 0, slot_ = 0, line_ = 0, per_call_ = 0;
};

// paged_attention.cpp's `attend` for every kv head of the item in one call: acc [kv_heads, group, D] and
// running_max / running_sum [kv_heads, group] (a bf16 cache needs no k_scale / v_scale).
template <int kHeadDim>
void attend_bf16(const WorkItem& item, const Layout& L, const c10::BFloat16* query, const c10::BFloat16* cache,
                 const int64_t* block_table, float scale, float* acc, float* running_max, float* running_sum) {
  static_assert(kHeadDim % 32 == 0, "one AVX-512 BF16 dot product covers 32 dims");
  constexpr int kPairVectors = kHeadDim / 32, kFloatVectors = kHeadDim / 16;
  const int64_t BS = L.block_size, slot = L.cache_slot_stride, heads = L.num_kv_heads * L.group;
  const __m512 scale_vector = _mm512_set1_ps(scale);
  std::fill(running_max, running_max + heads, -std::numeric_limits<float>::infinity());
  std::fill(running_sum, running_sum + heads, 0.0f);
  std::fill(acc, acc + heads * kHeadDim, 0.0f);
  // Chunks of keys outside, heads inside (every query head of every kv head): a chunk's slots, which hold all
  // kv heads' rows side by side, stay in L1/L2 while each head reads its rows, whatever the item's length
  // (walking a long item head by head had each head's lines fetched from memory on their own: 4 decodes at
  // 8000 tokens ~8 % slower), and a head's accumulator stays in registers across the chunk. A head first
  // scores the whole chunk, then takes its max, rescales what it accumulated once and weighs every key against
  // that max: the horizontal max and sum, the scalar e^x and the rescale happen once per chunk, and no chain
  // of them runs from one 16 keys to the next. While the keys are walked, acc vector 2c of a head holds dims 32c + 8i +
  // {0..3} of each 128-bit lane i and vector 2c + 1 dims 32c + 8i + {4..7}: the order unpacklo/unpackhi_epi16
  // give two interleaved value rows.
  // The keys' offsets in the cache (the same for every head) of the current chunk and the next one.
  int64_t chunk_rows[2][kKeysPerChunk];
  alignas(64) float scores[kKeysPerChunk];
  alignas(64) uint32_t probability_pairs[kKeysPerChunk / 2];  // bf16 probabilities of keys 2i (low), 2i + 1
  const auto fill_rows = [&](int64_t chunk_begin, int64_t* rows) {
    const int64_t count = std::max<int64_t>(0, std::min(item.key_end - chunk_begin, kKeysPerChunk));
    for (int64_t i = 0, block = chunk_begin / BS, offset = chunk_begin % BS; i < count; ++i) {
      rows[i] = block_table[block] * L.cache_block_stride + offset * slot;
      if (++offset == BS) offset = 0, ++block;
    }
    return count;
  };
  ChunkPrefetcher prefetcher(L, cache);
  int64_t next_count = fill_rows(item.key_begin, chunk_rows[0]);
  for (int64_t chunk_begin = item.key_begin, parity = 0; chunk_begin < item.key_end;
       chunk_begin += kKeysPerChunk, parity ^= 1) {
    const int64_t count = next_count;
    const int64_t* rows = chunk_rows[parity];
    next_count = fill_rows(chunk_begin + kKeysPerChunk, chunk_rows[parity ^ 1]);
    prefetcher.start(chunk_rows[parity ^ 1], next_count, heads * ((count + kKeysPerRun - 1) / kKeysPerRun));
    for (int64_t head = 0; head < heads; ++head) {  // the item's query heads, kv head by kv head
      const int64_t kv_head = head / L.group;
      const c10::BFloat16* q_head = query + item.token * L.q_token_stride + head * L.q_head_stride;
      const c10::BFloat16* keys = cache + kv_head * L.cache_head_stride;
      const c10::BFloat16* values = keys + L.cache_kv_stride;
      __m512bh q_pairs[kPairVectors];
      for (int c = 0; c < kPairVectors; ++c) q_pairs[c] = load_bf16_pairs(q_head + 32 * c);
      __m512 chunk_max = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      for (int64_t run = 0; run < count; run += kKeysPerRun) {
        const int64_t keys_in_run = std::min(kKeysPerRun, count - run);
        prefetcher.step();
        __m512 partial[kKeysPerRun];
        for (int64_t j = 0; j < kKeysPerRun; ++j) {
          partial[j] = _mm512_setzero_ps();
          if (j >= keys_in_run) continue;
          for (int c = 0; c < kPairVectors; ++c)
            partial[j] = _mm512_dpbf16_ps(partial[j], q_pairs[c], load_bf16_pairs(keys + rows[run + j] + 32 * c));
        }
        const __mmask16 valid = static_cast<__mmask16>((1u << keys_in_run) - 1u);
        const __m512 run_scores = _mm512_mask_blend_ps(
            valid, _mm512_set1_ps(-std::numeric_limits<float>::infinity()),
            _mm512_mul_ps(lane_totals(partial), scale_vector));
        _mm512_store_ps(scores + run, run_scores);
        chunk_max = _mm512_max_ps(chunk_max, run_scores);
      }
      const float head_max = std::max(running_max[head], _mm512_reduce_max_ps(chunk_max));
      const float correction = exp_poly(running_max[head] - head_max);  // 0 on the first chunk (-inf)
      running_max[head] = head_max;
      float* head_acc = acc + head * kHeadDim;
      __m512 accumulator[kFloatVectors];
      for (int c = 0; c < kFloatVectors; ++c)
        accumulator[c] = _mm512_mul_ps(_mm512_loadu_ps(head_acc + 16 * c), _mm512_set1_ps(correction));
      // Probabilities rounded to bf16 and summed as rounded, so that the normaliser weighs exactly what the
      // values are multiplied by; 0 in the lanes past the chunk's keys.
      __m512 sum = _mm512_setzero_ps();
      for (int64_t run = 0; run < count; run += kKeysPerRun) {
        const __m256i rounded = reinterpret_cast<__m256i>(
            _mm512_cvtneps_pbh(exp_poly_16(_mm512_sub_ps(_mm512_load_ps(scores + run), _mm512_set1_ps(head_max)))));
        _mm256_store_si256(reinterpret_cast<__m256i*>(probability_pairs + run / 2), rounded);
        sum = _mm512_add_ps(sum, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(rounded), 16)));
      }
      running_sum[head] = running_sum[head] * correction + _mm512_reduce_add_ps(sum);
      for (int64_t j = 0; j < count; j += 2) {  // keys j and j + 1 in one dot product per 16 dims
        const __m512bh pair = reinterpret_cast<__m512bh>(_mm512_set1_epi32(probability_pairs[j / 2]));
        for (int c = 0; c < kPairVectors; ++c) {
          const __m512i first = _mm512_loadu_si512(values + rows[j] + 32 * c);
          // past the chunk the second row may be another sequence's or unwritten: zero, not p = 0 times it
          const __m512i second =
              j + 1 < count ? _mm512_loadu_si512(values + rows[j + 1] + 32 * c) : _mm512_setzero_si512();
          accumulator[2 * c] = _mm512_dpbf16_ps(
              accumulator[2 * c], reinterpret_cast<__m512bh>(_mm512_unpacklo_epi16(first, second)), pair);
          accumulator[2 * c + 1] = _mm512_dpbf16_ps(
              accumulator[2 * c + 1], reinterpret_cast<__m512bh>(_mm512_unpackhi_epi16(first, second)), pair);
        }
      }
      for (int c = 0; c < kFloatVectors; ++c) _mm512_storeu_ps(head_acc + 16 * c, accumulator[c]);
    }
  }
  const __m512i lower_dims = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i upper_dims = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int64_t head = 0; head < heads; ++head)
    for (int c = 0; c < kPairVectors; ++c) {  // back to dim order
      float* dims = acc + head * kHeadDim + 32 * c;
      const __m512 lower = _mm512_loadu_ps(dims), upper = _mm512_loadu_ps(dims + 16);
      _mm512_storeu_ps(dims, _mm512_permutex2var_ps(lower, lower_dims, upper));
      _mm512_storeu_ps(dims + 16, _mm512_permutex2var_ps(lower, upper_dims, upper));
    }
}

}  // namespace paged_kernels

#endif
