// What the paged attention kernels share: the work item, the cache/query layout, the online softmax step
// that folds one run of scores into an item's running max, sum and accumulator, and the argument checks.
#pragma once

#include <ATen/core/Tensor.h>

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

// query [T, Hq, D] and kv_cache [2, blocks, block_size, Hkv, D], as checked by check_paged_arguments.
inline Layout layout_of(const at::Tensor& query, const at::Tensor& kv_cache) {
  Layout L;
  L.num_heads = query.size(1);
  L.num_kv_heads = kv_cache.size(3);
  L.head_dim = query.size(2);
  L.block_size = kv_cache.size(2);
  L.group = L.num_heads / L.num_kv_heads;
  L.q_token_stride = query.stride(0);
  L.q_head_stride = query.stride(1);
  L.cache_kv_stride = kv_cache.stride(0);
  L.cache_block_stride = kv_cache.stride(1);
  L.cache_slot_stride = kv_cache.stride(2);
  L.cache_head_stride = kv_cache.stride(3);
  return L;
}

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

// The checks paged_attention and prefill_attention share (shapes, layout, metadata); `op` names the caller.
inline void check_paged_arguments(const char* op, const at::Tensor& output, const at::Tensor& query,
                                  const at::Tensor& kv_cache, const at::Tensor& query_start_loc,
                                  const at::Tensor& seq_lens, const at::Tensor& block_tables,
                                  const at::Tensor& seq_ids, double k_scale, double v_scale) {
  TORCH_CHECK(query.device().is_cpu() && kv_cache.device().is_cpu(), op, ": CPU tensors only");
  TORCH_CHECK(query.dim() == 3 && kv_cache.dim() == 5 && kv_cache.size(0) == 2,
              op, ": query [T, Hq, D] and kv_cache [2, blocks, block_size, Hkv, D] expected");
  TORCH_CHECK(kv_cache.scalar_type() == at::kFloat8_e4m3fn || (k_scale == 1.0 && v_scale == 1.0),
              op, ": scales apply to an fp8 cache only");
  TORCH_CHECK(query.stride(2) == 1 && kv_cache.stride(4) == 1 && output.is_contiguous(),
              op, ": the head dimension must be contiguous");
  TORCH_CHECK(query.size(2) == kv_cache.size(4) && query.size(1) % kv_cache.size(3) == 0,
              op, ": head_dim must match and query heads be a multiple of kv heads");
  for (const at::Tensor* index : {&query_start_loc, &seq_lens, &block_tables, &seq_ids})
    TORCH_CHECK(index->scalar_type() == at::kLong && index->device().is_cpu() &&
                    (index->dim() == 1 ? index->is_contiguous() : index->stride(1) == 1),
                op, ": metadata must be int64 CPU tensors");
  TORCH_CHECK(query_start_loc.size(0) == seq_lens.size(0) + 1 && block_tables.size(0) == seq_lens.size(0),
              op, ": metadata sizes disagree");
  const int64_t* ids = seq_ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < seq_ids.size(0); ++i)
    TORCH_CHECK(0 <= ids[i] && ids[i] < seq_lens.size(0), op, ": seq_ids out of range");
}

}  // namespace paged_kernels
