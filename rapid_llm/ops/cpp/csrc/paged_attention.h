// What the paged attention item kernels share: the work item, the cache/query layout, and the online
// softmax step that folds one run of scores into an item's running max, sum and accumulator.
#pragma once

#include <torch/extension.h>

#include "exp_poly.h"

#include <algorithm>
#include <cstdint>

namespace paged_kernels {

struct WorkItem {
  int64_t token;
  int64_t seq;
  int64_t key_begin;  // keys [key_begin, key_end) of the sequence
  int64_t key_end;
  int64_t partial;    // row in the partial buffers, or -1: the item covers all the token's keys
};

struct Layout {
  int64_t num_heads, num_kv_heads, head_dim, block_size, group;
  int64_t q_token_stride, q_head_stride;
  int64_t cache_kv_stride, cache_block_stride, cache_slot_stride, cache_head_stride;
};

// scores[0, count) become e^(score - new max); the running sum and the accumulator acc[0, D) are
// rescaled to the new max (one rescale per run of keys, none while the max holds).
inline void online_softmax_step(float* scores, int64_t count, float& running_max, float& running_sum, float* acc,
                                int64_t D) {
  float block_max = running_max;
  for (int64_t j = 0; j < count; ++j) block_max = std::max(block_max, scores[j]);
  const float correction = exp_poly(running_max - block_max);  // 0 on the first run (-inf)
  float block_sum = 0.0f;
#pragma omp simd reduction(+ : block_sum)
  for (int64_t j = 0; j < count; ++j) {
    scores[j] = exp_poly(scores[j] - block_max);
    block_sum += scores[j];
  }
  running_sum = running_sum * correction + block_sum;
  running_max = block_max;
  if (correction != 1.0f) {
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) acc[d] *= correction;
  }
}

}  // namespace paged_kernels
