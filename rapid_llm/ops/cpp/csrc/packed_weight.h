// What the linear kernels over amx_pack_weight's layout ([N/16][K/2][16][2] bf16) share: its block sizes, the
// argument checks of a call and the bias widened to fp32 (amx_linear.cpp, avx512_linear.cpp), and the loop of
// claimed tasks avx512_linear.cpp's decode calls run.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <atomic>

namespace packed_weight {

constexpr int64_t kOutputsPerBlock = 16;  // one AVX-512 fp32 vector, one AMX tile's columns
constexpr int64_t kInputsPerStep = 32;    // one AMX tile's depth (16 input pairs)

// How far ahead (in 64-byte pair rows of one output block) a kernel streaming weights from memory asks for them.
// The hardware prefetcher alone left a one-row decode at ~27 GB/s on the 2-core AMX Xeon; 32 rows (2 KB per
// stream) ahead took it to ~31 GB/s (8: ~30, 64 and 128: no better than 32; a non-temporal hint: 11 GB/s).
constexpr int64_t kPrefetchPairs = 32;

// Ask for the pair row `kPrefetchPairs` rows after `row` (past a block's end it is the next block's, or
// nothing: a prefetch never faults).
inline void prefetch_ahead(const void* row) {
  __builtin_prefetch(static_cast<const char*>(row) + kPrefetchPairs * 2 * kOutputsPerBlock * 2, 0, 3);
}

// Exactly the shapes amx_pack_weight makes: whole pairs of output blocks, whole 32-input steps.
inline void check_packed(const char* op, const at::Tensor& packed) {
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == 2 * kOutputsPerBlock && packed.scalar_type() == at::kBFloat16 &&
                  packed.is_contiguous() && packed.device().is_cpu() && packed.size(0) % 2 == 0 &&
                  packed.size(1) % (kInputsPerStep / 2) == 0,
              op, ": the weight must come from amx_pack_weight");
}

// fn(task) for every task in [0, num_tasks), each thread claiming the next unclaimed task when it is free
// instead of a fixed share: a thread the OS preempts (the serving processes share these cores) holds back only
// the task it has, while the others take the rest of its share. One task runs inline, with no thread woken.
template <typename Fn>
void for_each_task_claimed(int64_t num_tasks, const Fn& fn) {
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(num_tasks, at::get_num_threads()), 1, [&](int64_t, int64_t) {
    for (int64_t task = next.fetch_add(1, std::memory_order_relaxed); task < num_tasks;
         task = next.fetch_add(1, std::memory_order_relaxed))
      fn(task);
  });
}

struct Call {
  int64_t M, K, N;  // x [M, K], out [M, N]
};

inline Call check_call(const char* op, const at::Tensor& x, const at::Tensor& packed,
                       const c10::optional<at::Tensor>& bias) {
  check_packed(op, packed);
  const int64_t K = packed.size(1) * 2, N = packed.size(0) * kOutputsPerBlock;
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K && x.scalar_type() == at::kBFloat16 && x.is_contiguous() &&
                  x.device().is_cpu(),
              op, ": x must be contiguous CPU bf16 [rows, ", K, "]");
  TORCH_CHECK(!bias.has_value() || !bias->defined() || (bias->dim() == 1 && bias->numel() == N),
              op, ": the bias must be [", N, "]");
  return {x.size(0), K, N};
}

// The bias as contiguous fp32, or an undefined tensor when there is none.
inline at::Tensor bias_as_fp32(const c10::optional<at::Tensor>& bias) {
  if (!bias.has_value() || !bias->defined()) return {};
  return bias->to(at::kFloat).contiguous();
}

}  // namespace packed_weight
