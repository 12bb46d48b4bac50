// bf16 linear layers on AVX-512 BF16 CPUs without AMX (the `cpu_avx512` kernel), over amx_pack_weight's layout
// [N/16][K/2][16][2]: one 64-byte row of it holds 16 outputs' weights for one pair of inputs, so one AVX-512
// BF16 dot-product instruction with a broadcast input pair advances 16 outputs. A micro-kernel keeps up to
// 6 rows x 4 blocks of 16 outputs in registers (24 accumulators; 12 x 2 measured up to 10 % slower at 128+
// rows), loads each weight row once per pass of rows and rounds the fp32 sums to bf16 (plus bias) once.
// Tasks are (group of 4 output blocks, equal panel of rows) in group-major order: the group's weights
// (K x 128 bytes) stay in L2 while the panel's rows pass, each thread's range of tasks covers its own outputs
// over every row, and a one-row call (decode) streams every weight exactly once across the threads. Built
// only where the compiler targets AVX512-BF16 (-march=native on such a CPU); elsewhere
// `avx512_linear_supported()` is false.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "packed_weight.h"

#include <algorithm>
#include <array>
#include <utility>

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define RAPID_LLM_HAS_AVX512_LINEAR 1
#include <immintrin.h>
#endif

namespace {

#ifdef RAPID_LLM_HAS_AVX512_LINEAR

constexpr int64_t kBlock = packed_weight::kOutputsPerBlock;
constexpr int64_t kBlocksPerTask = 4;
constexpr int kMaxRows = 6;        // 6 rows x 4 blocks = 24 accumulators (of 32 vector registers)
constexpr int64_t kPanelRows = 96;  // rows per task: sixteen 6-row passes over the group's cached weights

using MicroKernel = void (*)(const uint32_t*, int64_t, const uint32_t*, int64_t, const float*, at::BFloat16*,
                             int64_t);

// out[r][(block + b) * 16, +16) for R rows (row stride K/2 input pairs) x B blocks, over all K/2 pairs.
template <int R, int B>
void micro_kernel(const uint32_t* x, int64_t pairs, const uint32_t* packed, int64_t block, const float* bias,
                  at::BFloat16* out, int64_t N) {
  __m512 acc[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_ps();
  const uint32_t* weights = packed + block * pairs * kBlock;
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh w[B];
    for (int b = 0; b < B; ++b) {
      const uint32_t* row = weights + (b * pairs + p) * kBlock;
      if (R == 1) packed_weight::prefetch_ahead(row);  // a one-row pass streams from memory; more reuse L2
      w[b] = (__m512bh)_mm512_loadu_si512(row);
    }
    for (int r = 0; r < R; ++r) {
      const __m512bh input = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[r * pairs + p]));
      for (int b = 0; b < B; ++b) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], input, w[b]);
    }
  }
  for (int b = 0; b < B; ++b) {
    const int64_t n = (block + b) * kBlock;
    const __m512 bias_vector = bias ? _mm512_loadu_ps(bias + n) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * N + n),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(acc[r][b], bias_vector)));
  }
}

template <int B, int... Rows>
constexpr std::array<MicroKernel, sizeof...(Rows)> kernels_for(std::integer_sequence<int, Rows...>) {
  return {micro_kernel<Rows + 1, B>...};
}

// [rows - 1]: the kernel for that many rows.
constexpr auto kTwoBlocks = kernels_for<2>(std::make_integer_sequence<int, kMaxRows>{});
constexpr auto kFourBlocks = kernels_for<4>(std::make_integer_sequence<int, kMaxRows>{});

void linear(const at::BFloat16* x, int64_t M, int64_t K, const at::BFloat16* packed, int64_t N, const float* bias,
            at::BFloat16* out) {
  const int64_t pairs = K / 2, blocks = N / kBlock;
  const int64_t groups = (blocks + kBlocksPerTask - 1) / kBlocksPerTask;
  // Equal panels of whole 12-row passes, so that no thread is left with a short last panel.
  const int64_t panels = (M + kPanelRows - 1) / kPanelRows;
  const int64_t panel_rows = ((M + panels - 1) / panels + kMaxRows - 1) / kMaxRows * kMaxRows;
  const auto* x_pairs = reinterpret_cast<const uint32_t*>(x);
  const auto* weights = reinterpret_cast<const uint32_t*>(packed);
  // Tasks in group-major order: the threads' contiguous task ranges split the outputs, each over every row.
  at::parallel_for(0, groups * panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t first_block = task / panels * kBlocksPerTask, panel = task % panels;
      const int64_t group_blocks = std::min(kBlocksPerTask, blocks - first_block);
      const int64_t panel_end = std::min(M, (panel + 1) * panel_rows);
      for (int64_t row = panel * panel_rows; row < panel_end;) {
        const int64_t rows = std::min<int64_t>(panel_end - row, kMaxRows);
        if (group_blocks == kBlocksPerTask) {
          kFourBlocks[rows - 1](x_pairs + row * pairs, pairs, weights, first_block, bias, out + row * N, N);
        } else {  // the packer makes an even number of blocks, so the last group may have 2
          kTwoBlocks[rows - 1](x_pairs + row * pairs, pairs, weights, first_block, bias, out + row * N, N);
        }
        row += rows;
      }
    }
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

at::Tensor avx512_linear(const at::Tensor& x, const at::Tensor& packed,
                         const c10::optional<at::Tensor>& bias) {
  const packed_weight::Call call = packed_weight::check_call("avx512_linear", x, packed, bias);
  auto out = at::empty({call.M, call.N}, x.options());
  if (call.M == 0) return out;
#ifdef RAPID_LLM_HAS_AVX512_LINEAR
  const at::Tensor bias_fp32 = packed_weight::bias_as_fp32(bias);
  linear(x.data_ptr<at::BFloat16>(), call.M, call.K, packed.data_ptr<at::BFloat16>(), call.N,
         bias_fp32.defined() ? bias_fp32.data_ptr<float>() : nullptr, out.data_ptr<at::BFloat16>());
  return out;
#else
  TORCH_CHECK(false, "avx512_linear: this build has no AVX512-BF16 code (the CPU lacks avx512_bf16)");
  return out;
#endif
}
