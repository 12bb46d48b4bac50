// The item kernel of paged_attention.cpp for a bf16 query and bf16 cache on AVX-512 BF16 CPUs, with
// head_dim a multiple of 32. The generic kernel spends most of a decode on one horizontal sum per key and
// query head; here a key's dot product with a query head is one AVX-512 BF16 instruction per 32 dims,
// which leaves 16 partial sums, and the partial vectors of 16 keys are totalled lane-wise by one
// transpose-and-add tree (45 instructions for 16 scores). Value rows are widened to fp32 once and
// accumulated into every query head of the group; the online softmax of a run stays in one vector.
// Scores are scaled after the dot product (the generic
// kernel scales the query first), so results differ from it by rounding only.
#pragma once

#include "paged_attention.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define RAPID_LLM_HAS_AVX512_BF16_ATTENTION 1

#include <immintrin.h>

#include <limits>
#include <vector>

namespace paged_kernels {

constexpr int64_t kKeysPerRun = 16;  // one score per lane of an fp32 vector

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

// online_softmax_step for one run of up to 16 scores held in a vector (lanes >= count are ignored);
// the probabilities are stored to `probabilities`.
inline void online_softmax_run(__m512 scores, int64_t count, float& running_max, float& running_sum, float* acc,
                               int64_t D, float* probabilities) {
  const __mmask16 valid = static_cast<__mmask16>((1u << count) - 1u);
  scores = _mm512_mask_blend_ps(valid, _mm512_set1_ps(-std::numeric_limits<float>::infinity()), scores);
  const float block_max = std::max(running_max, _mm512_reduce_max_ps(scores));
  const float correction = exp_poly(running_max - block_max);  // 0 on the first run (-inf)
  const __m512 p = exp_poly_16(_mm512_sub_ps(scores, _mm512_set1_ps(block_max)));  // 0 in the ignored lanes
  _mm512_storeu_ps(probabilities, p);
  running_sum = running_sum * correction + _mm512_reduce_add_ps(p);
  running_max = block_max;
  if (correction != 1.0f) {
    const __m512 c = _mm512_set1_ps(correction);
    for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(acc + d, _mm512_mul_ps(c, _mm512_loadu_ps(acc + d)));
  }
}

inline __m512bh load_bf16_pairs(const c10::BFloat16* src) {
  return reinterpret_cast<__m512bh>(_mm512_loadu_si512(src));
}

inline __m512 widen_bf16(const c10::BFloat16* src) {  // 16 bf16 -> fp32, exact
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))), 16));
}

// Same contract as paged_attention.cpp's `attend` (k_scale / v_scale are 1 for a bf16 cache).
template <int kHeadDim>
void attend_bf16(const WorkItem& item, int64_t kv_head, const Layout& L, const c10::BFloat16* query,
                 const c10::BFloat16* cache, const int64_t* block_table, float scale, float, float, float* acc,
                 float* running_max, float* running_sum, std::vector<float>& scratch) {
  static_assert(kHeadDim % 32 == 0, "one AVX-512 BF16 dot product covers 32 dims");
  constexpr int kPairVectors = kHeadDim / 32, kFloatVectors = kHeadDim / 16;
  const int64_t G = L.group, BS = L.block_size;
  scratch.resize(G * kKeysPerRun);
  float* probabilities = scratch.data();  // [G, 16]
  const c10::BFloat16* q = query + item.token * L.q_token_stride + kv_head * G * L.q_head_stride;
  for (int64_t g = 0; g < G; ++g) {
    running_max[g] = -std::numeric_limits<float>::infinity();
    running_sum[g] = 0.0f;
  }
  std::fill(acc, acc + G * kHeadDim, 0.0f);
  const c10::BFloat16* keys = cache + kv_head * L.cache_head_stride;
  const c10::BFloat16* values = keys + L.cache_kv_stride;
  const __m512 scale_vector = _mm512_set1_ps(scale);
  for (int64_t start = item.key_begin; start < item.key_end;) {
    const int64_t offset = start % BS;
    const int64_t count = std::min({kKeysPerRun, BS - offset, item.key_end - start});
    const int64_t row0 = block_table[start / BS] * L.cache_block_stride + offset * L.cache_slot_stride;
    for (int64_t g = 0; g < G; ++g) {
      const c10::BFloat16* q_head = q + g * L.q_head_stride;
      __m512 partial[kKeysPerRun];
      for (int64_t j = 0; j < kKeysPerRun; ++j) {
        partial[j] = _mm512_setzero_ps();
        if (j >= count) continue;
        const c10::BFloat16* key = keys + row0 + j * L.cache_slot_stride;
        for (int c = 0; c < kPairVectors; ++c)
          partial[j] = _mm512_dpbf16_ps(partial[j], load_bf16_pairs(q_head + 32 * c), load_bf16_pairs(key + 32 * c));
      }
      online_softmax_run(_mm512_mul_ps(lane_totals(partial), scale_vector), count, running_max[g], running_sum[g],
                         acc + g * kHeadDim, kHeadDim, probabilities + g * kKeysPerRun);
    }
    for (int64_t j = 0; j < count; ++j) {
      const c10::BFloat16* value = values + row0 + j * L.cache_slot_stride;
      __m512 row[kFloatVectors];
      for (int c = 0; c < kFloatVectors; ++c) row[c] = widen_bf16(value + 16 * c);
      for (int64_t g = 0; g < G; ++g) {
        const __m512 p = _mm512_set1_ps(probabilities[g * kKeysPerRun + j]);
        float* a = acc + g * kHeadDim;
        for (int c = 0; c < kFloatVectors; ++c)
          _mm512_storeu_ps(a + 16 * c, _mm512_fmadd_ps(p, row[c], _mm512_loadu_ps(a + 16 * c)));
      }
    }
    start += count;
  }
}

}  // namespace paged_kernels

#endif
