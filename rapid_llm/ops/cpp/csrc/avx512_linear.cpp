// bf16 linear layers on AVX-512 BF16 CPUs without AMX (the `cpu_avx512` kernel), over amx_pack_weight's layout
// [N/16][K/2][16][2]: one 64-byte row of it holds 16 outputs' weights for one pair of inputs, so one AVX-512
// BF16 dot-product instruction with a broadcast input pair advances 16 outputs. A micro-kernel keeps up to
// 6 rows x 4 blocks of 16 outputs in registers (24 accumulators; 12 x 2 measured up to 10 % slower at 128+
// rows), loads each weight row once per pass of rows and rounds the fp32 sums to bf16 (plus bias) once.
// Tasks are (group of 4 output blocks, equal panel of rows) in group-major order: the group's weights
// (K x 128 bytes) stay in L2 while the panel's rows pass, each thread's range of tasks covers its own outputs
// over every row. A call of one panel (decode) streams every weight exactly once across the threads, each
// thread claiming the next group as it frees up, so a thread the serving processes preempt holds back one group
// rather than its whole share.
// `avx512_silu_and_mul_linear` is the same over a merged [gate; up] weight with tasks of 2 gate blocks and their
// up blocks (b + N/32), writing silu(gate) * up (gated_epilogue.h; bit-identical to the two calls). Built
// only where the compiler targets AVX512-BF16 (-march=native on such a CPU); elsewhere
// `avx512_linear_supported()` is false.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "gated_epilogue.h"
#include "packed_weight.h"

#include <algorithm>
#include <array>
#include <utility>

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define RAPID_LLM_HAS_AVX512_LINEAR 1
#include <immintrin.h>
#endif

at::Tensor silu_and_mul(const at::Tensor& x);

namespace {

#ifdef RAPID_LLM_HAS_AVX512_LINEAR

constexpr int64_t kBlock = packed_weight::kOutputsPerBlock;
constexpr int64_t kBlocksPerTask = 4;
constexpr int kMaxRows = 6;        // 6 rows x 4 blocks = 24 accumulators (of 32 vector registers)
constexpr int64_t kPanelRows = 96;  // rows per task: sixteen 6-row passes over the group's cached weights

using MicroKernel = void (*)(const uint32_t*, int64_t, const uint32_t*, int64_t, const float*, at::BFloat16*,
                             int64_t);

// R rows (row stride K/2 input pairs) x B blocks over all K/2 pairs. Plain: blocks first + b, stored at
// out[r][(first + b) * 16, +16) (row stride N). Gated: gate blocks first + b for b < B/2 paired with their up
// blocks (+ N/32), silu(gate) * up stored at out[r][(first + b) * 16, +16) (row stride N/2).
template <int R, int B, bool GATED>
void micro_kernel(const uint32_t* x, int64_t pairs, const uint32_t* packed, int64_t first, const float* bias,
                  at::BFloat16* out, int64_t N) {
  static_assert(!GATED || B % 2 == 0, "a gated task pairs each gate block with its up block");
  __m512 acc[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_ps();
  int64_t blocks[B];
  for (int b = 0; b < B; ++b) blocks[b] = GATED && b >= B / 2 ? first + b - B / 2 + N / 32 : first + b;
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh w[B];
    for (int b = 0; b < B; ++b) {
      const uint32_t* row = packed + (blocks[b] * pairs + p) * kBlock;
      if (R == 1) packed_weight::prefetch_ahead(row);  // a one-row pass streams from memory; more reuse L2
      w[b] = (__m512bh)_mm512_loadu_si512(row);
    }
    for (int r = 0; r < R; ++r) {
      const __m512bh input = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[r * pairs + p]));
      for (int b = 0; b < B; ++b) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], input, w[b]);
    }
  }
  const auto bias_of = [&](int b) { return bias ? _mm512_loadu_ps(bias + blocks[b] * kBlock) : _mm512_setzero_ps(); };
  if constexpr (GATED) {
    for (int b = 0; b < B / 2; ++b) {
      const __m512 gate_bias = bias_of(b), up_bias = bias_of(b + B / 2);
      for (int r = 0; r < R; ++r)
        gated_epilogue::store_16(_mm512_add_ps(acc[r][b], gate_bias), _mm512_add_ps(acc[r][b + B / 2], up_bias),
                                 out + r * (N / 2) + (first + b) * kBlock);
    }
  } else {
    for (int b = 0; b < B; ++b) {
      const __m512 bias_vector = bias_of(b);
      for (int r = 0; r < R; ++r)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * N + (first + b) * kBlock),
                            (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(acc[r][b], bias_vector)));
    }
  }
}

template <int B, bool GATED, int... Rows>
constexpr std::array<MicroKernel, sizeof...(Rows)> kernels_for(std::integer_sequence<int, Rows...>) {
  return {micro_kernel<Rows + 1, B, GATED>...};
}

// [rows - 1]: the kernel for that many rows.
constexpr auto kTwoBlocks = kernels_for<2, false>(std::make_integer_sequence<int, kMaxRows>{});
constexpr auto kFourBlocks = kernels_for<4, false>(std::make_integer_sequence<int, kMaxRows>{});
#ifdef RAPID_LLM_HAS_SILU_BF16
constexpr auto kGatedTwoBlocks = kernels_for<2, true>(std::make_integer_sequence<int, kMaxRows>{});
constexpr auto kGatedFourBlocks = kernels_for<4, true>(std::make_integer_sequence<int, kMaxRows>{});
#endif

// Plain (kernels kTwoBlocks / kFourBlocks, out [M, N]) or gated (the gated tables, out [M, N/2]): tasks of 4
// blocks (gated: 2 gate blocks and their up blocks) x equal row panels.
void linear(const at::BFloat16* x, int64_t M, int64_t K, const at::BFloat16* packed, int64_t N, const float* bias,
            at::BFloat16* out, const std::array<MicroKernel, kMaxRows>& two_blocks,
            const std::array<MicroKernel, kMaxRows>& four_blocks, bool gated) {
  const int64_t pairs = K / 2, out_stride = gated ? N / 2 : N;
  const int64_t firsts = gated ? N / 32 : N / kBlock;  // the blocks a task's first block counts in
  const int64_t per_task = gated ? kBlocksPerTask / 2 : kBlocksPerTask;
  const int64_t groups = (firsts + per_task - 1) / per_task;
  // Equal panels of whole 6-row passes, so that no thread is left with a short last panel.
  const int64_t panels = (M + kPanelRows - 1) / kPanelRows;
  const int64_t panel_rows = ((M + panels - 1) / panels + kMaxRows - 1) / kMaxRows * kMaxRows;
  const auto* x_pairs = reinterpret_cast<const uint32_t*>(x);
  const auto* weights = reinterpret_cast<const uint32_t*>(packed);
  const auto run_task = [&](int64_t task) {
    const int64_t first = task / panels * per_task, panel = task % panels;
    const bool full = std::min(per_task, firsts - first) == per_task;
    const int64_t panel_end = std::min(M, (panel + 1) * panel_rows);
    for (int64_t row = panel * panel_rows; row < panel_end;) {
      const int64_t rows = std::min<int64_t>(panel_end - row, kMaxRows);
      // the packer makes an even number of blocks, so a last plain group may have 2 (a gated one: 1 gate block)
      (full ? four_blocks : two_blocks)[rows - 1](x_pairs + row * pairs, pairs, weights, first, bias,
                                                   out + row * out_stride, N);
      row += rows;
    }
  };
  if (panels == 1) {  // each group's weights are read once whichever thread takes it: hand them out as asked
    packed_weight::for_each_task_claimed(groups, run_task);
    return;
  }
  // Tasks in group-major order: the threads' contiguous task ranges split the outputs, each over every row.
  at::parallel_for(0, groups * panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) run_task(task);
  });
}

#endif  // RAPID_LLM_HAS_AVX512_LINEAR

}  // namespace

bool avx512_linear_supported() {
#ifdef RAPID_LLM_HAS_AVX512_LINEAR
  return true;
#else
  return false;
#endif
}

namespace {

at::Tensor run_packed(const char* op, const at::Tensor& x, const at::Tensor& packed,
                      const c10::optional<at::Tensor>& bias, bool gated) {
  const packed_weight::Call call = packed_weight::check_call(op, x, packed, bias);
  auto out = at::empty({call.M, gated ? call.N / 2 : call.N}, x.options());
  if (call.M == 0) return out;
#ifdef RAPID_LLM_HAS_AVX512_LINEAR
  const at::Tensor bias_fp32 = packed_weight::bias_as_fp32(bias);
  const float* bias_data = bias_fp32.defined() ? bias_fp32.data_ptr<float>() : nullptr;
  const auto* x_data = x.data_ptr<at::BFloat16>();
  const auto* weight = packed.data_ptr<at::BFloat16>();
  if (!gated) {
    linear(x_data, call.M, call.K, weight, call.N, bias_data, out.data_ptr<at::BFloat16>(), kTwoBlocks, kFourBlocks,
           false);
    return out;
  }
#ifdef RAPID_LLM_HAS_SILU_BF16
  linear(x_data, call.M, call.K, weight, call.N, bias_data, out.data_ptr<at::BFloat16>(), kGatedTwoBlocks,
         kGatedFourBlocks, true);
  return out;
#else  // no AVX-512 BW/DQ/VL for the gated epilogue: the two calls it equals
  return silu_and_mul(run_packed(op, x, packed, bias, false));
#endif
#else
  TORCH_CHECK(false, op, ": this build has no AVX512-BF16 code (the CPU lacks avx512_bf16)");
  return out;
#endif
}

}  // namespace

at::Tensor avx512_linear(const at::Tensor& x, const at::Tensor& packed,
                         const c10::optional<at::Tensor>& bias) {
  return run_packed("avx512_linear", x, packed, bias, false);
}

at::Tensor avx512_silu_and_mul_linear(const at::Tensor& x, const at::Tensor& packed,
                                      const c10::optional<at::Tensor>& bias) {
  return run_packed("avx512_silu_and_mul_linear", x, packed, bias, true);
}
