// bf16 linear layers on AMX / AVX-512 BF16 CPUs over a weight packed once, for the `cpu_amx` kernel.
// The packed layout is [N/16][K/2][16][2]: per block of 16 outputs, per pair of inputs, the 16 outputs'
// two weights side by side. One 64-byte row of it is both an AVX-512 BF16 dot-product operand (one-row
// inputs: broadcast the input pair, 16 outputs per instruction, no horizontal sums) and a row of an AMX
// B tile (more rows: 16 x 32 x 16 products per tile instruction). The weight streams through once per
// call either way, and the fp32 sums are rounded to bf16 (plus bias) as each block finishes, so a call is
// one pass with no fp32 result tensor. Built only where the compiler targets AMX-BF16 and AVX512-BF16
// (-march=native on such a CPU); elsewhere `amx_linear_supported()` is false and the kernel is skipped.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "amx_tiles.h"
#include "packed_weight.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace {

using packed_weight::kInputsPerStep;
using packed_weight::kOutputsPerBlock;
constexpr int64_t kRowsPerTile = 16;

#ifdef RAPID_LLM_HAS_AMX

using amx_tiles::TileConfig;
using amx_tiles::tile_state_granted;

// Tiles 0-3: fp32 sums (rows x 16 outputs); 4-5: input rows x 32 inputs; 6-7: 16 input pairs x 16 outputs.
void configure_tiles(int input_rows) {
  TileConfig config;
  for (int tile = 0; tile < 6; ++tile) {
    config.rows[tile] = static_cast<uint8_t>(input_rows);
    config.bytes_per_row[tile] = 64;
  }
  for (int tile = 6; tile < 8; ++tile) {
    config.rows[tile] = kRowsPerTile;
    config.bytes_per_row[tile] = 64;
  }
  _tile_loadconfig(&config);
}

inline const at::BFloat16* pair_row(const at::BFloat16* packed, int64_t K, int64_t block, int64_t pair) {
  return packed + (block * (K / 2) + pair) * 2 * kOutputsPerBlock;
}

// rows x 16 fp32 sums (row stride sums_stride) + bias, rounded to bf16 into out (row stride N) at column n.
inline void store_rows(const float* sums, int64_t sums_stride, int rows, const float* bias, int64_t n,
                       at::BFloat16* out, int64_t N) {
  const __m512 bias_vector = bias ? _mm512_loadu_ps(bias + n) : _mm512_setzero_ps();
  for (int row = 0; row < rows; ++row) {
    const __m512 value = _mm512_add_ps(_mm512_loadu_ps(sums + row * sums_stride), bias_vector);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + row * N + n), (__m256i)_mm512_cvtneps_pbh(value));
  }
}

// One input row, BLOCKS blocks of 16 outputs from `block`: a dot-product chain per block (independent
// chains hide the instruction's latency).
template <int BLOCKS>
void one_row_blocks(const at::BFloat16* x, int64_t K, const at::BFloat16* packed, int64_t block, const float* bias,
                    at::BFloat16* out, int64_t N) {
  __m512 sums[BLOCKS];
  for (int b = 0; b < BLOCKS; ++b) sums[b] = _mm512_setzero_ps();
  const uint32_t* input_pairs = reinterpret_cast<const uint32_t*>(x);
  for (int64_t pair = 0; pair < K / 2; ++pair) {
    const __m512bh input = (__m512bh)_mm512_set1_epi32(static_cast<int>(input_pairs[pair]));
    for (int b = 0; b < BLOCKS; ++b) {
      const at::BFloat16* row = pair_row(packed, K, block + b, pair);
      packed_weight::prefetch_ahead(row);
      sums[b] = _mm512_dpbf16_ps(sums[b], input, (__m512bh)_mm512_loadu_si512(row));
    }
  }
  alignas(64) float block_sums[kOutputsPerBlock];
  for (int b = 0; b < BLOCKS; ++b) {
    _mm512_store_ps(block_sums, sums[b]);
    store_rows(block_sums, kOutputsPerBlock, 1, bias, (block + b) * kOutputsPerBlock, out, N);
  }
}

void one_row_linear(const at::BFloat16* x, int64_t K, const at::BFloat16* packed, int64_t N, const float* bias,
                    at::BFloat16* out) {
  constexpr int64_t kBlocksPerTask = 4;
  const int64_t blocks = N / kOutputsPerBlock;
  const int64_t tasks = (blocks + kBlocksPerTask - 1) / kBlocksPerTask;
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t block = task * kBlocksPerTask;
      switch (std::min(kBlocksPerTask, blocks - block)) {
        case 1: one_row_blocks<1>(x, K, packed, block, bias, out, N); break;
        case 2: one_row_blocks<2>(x, K, packed, block, bias, out, N); break;
        case 3: one_row_blocks<3>(x, K, packed, block, bias, out, N); break;
        default: one_row_blocks<4>(x, K, packed, block, bias, out, N); break;
      }
    }
  });
}

// Sums for `rows` (<= 16 with one input tile, else 32 with two) x 32 outputs from block pair `pair_block`,
// over all of K; rows are contiguous with stride K, the sums land in sums[32][32] (row stride 32).
template <bool TWO_INPUT_TILES>
void tile_block(const at::BFloat16* x, int64_t K, const at::BFloat16* packed, int64_t pair_block, float* sums) {
  _tile_zero(0);
  _tile_zero(1);
  if (TWO_INPUT_TILES) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t k = 0; k < K; k += kInputsPerStep) {
    _tile_loadd(4, x + k, K * 2);
    _tile_loadd(6, pair_row(packed, K, 2 * pair_block, k / 2), 64);
    _tile_loadd(7, pair_row(packed, K, 2 * pair_block + 1, k / 2), 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (TWO_INPUT_TILES) {
      _tile_loadd(5, x + kRowsPerTile * K + k, K * 2);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  constexpr int64_t stride = 2 * kOutputsPerBlock * 4;  // bytes per sums row
  _tile_stored(0, sums, stride);
  _tile_stored(1, sums + kOutputsPerBlock, stride);
  if (TWO_INPUT_TILES) {
    _tile_stored(2, sums + kRowsPerTile * 32, stride);
    _tile_stored(3, sums + kRowsPerTile * 32 + kOutputsPerBlock, stride);
  }
}

// Store sums[rows][32] as its two 16-output halves.
void store_pair_block(const float* sums, int rows, const float* bias, int64_t pair_block, at::BFloat16* out, int64_t N) {
  for (int side = 0; side < 2; ++side)
    store_rows(sums + side * kOutputsPerBlock, 32, rows, bias, (2 * pair_block + side) * kOutputsPerBlock, out, N);
}

// Up to 16 rows: one input tile of exactly those rows, tasks over pairs of output blocks.
void few_rows_linear(const at::BFloat16* x, int64_t M, int64_t K, const at::BFloat16* packed, int64_t N,
                     const float* bias, at::BFloat16* out) {
  at::parallel_for(0, N / 32, 1, [&](int64_t begin, int64_t end) {
    configure_tiles(static_cast<int>(M));
    alignas(64) float sums[32 * 32];
    for (int64_t pair_block = begin; pair_block < end; ++pair_block) {
      tile_block<false>(x, K, packed, pair_block, sums);
      store_pair_block(sums, static_cast<int>(M), bias, pair_block, out, N);
    }
    _tile_release();
  });
}

// More rows: 32-row blocks (the last one copied into a zero-padded buffer), grouped in panels of 256
// rows that stay in cache while every output block's weights pass once per panel.
void many_rows_linear(const at::BFloat16* x, int64_t M, int64_t K, const at::BFloat16* packed, int64_t N,
                      const float* bias, at::BFloat16* out) {
  constexpr int64_t kPanelRows = 256;
  const int64_t full_rows = M / 32 * 32;
  std::vector<at::BFloat16> tail(full_rows < M ? 32 * K : 0, at::BFloat16(0.0f));
  if (full_rows < M) std::memcpy(tail.data(), x + full_rows * K, (M - full_rows) * K * sizeof(at::BFloat16));
  for (int64_t panel = 0; panel < M; panel += kPanelRows) {
    const int64_t panel_end = std::min(M, panel + kPanelRows);
    at::parallel_for(0, N / 32, 1, [&](int64_t begin, int64_t end) {
      configure_tiles(kRowsPerTile);
      alignas(64) float sums[32 * 32];
      for (int64_t pair_block = begin; pair_block < end; ++pair_block)
        for (int64_t row = panel; row < panel_end; row += 32) {
          const bool is_tail = row >= full_rows;
          tile_block<true>(is_tail ? tail.data() : x + row * K, K, packed, pair_block, sums);
          store_pair_block(sums, static_cast<int>(std::min<int64_t>(32, M - row)), bias, pair_block,
                           out + row * N, N);
        }
      _tile_release();
    });
  }
}

#endif  // RAPID_LLM_HAS_AMX

}  // namespace

bool amx_linear_supported() {
#ifdef RAPID_LLM_HAS_AMX
  return tile_state_granted();
#else
  return false;
#endif
}

at::Tensor amx_pack_weight(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16, "amx_pack_weight: a 2-D bf16 weight");
  const int64_t N = weight.size(0), K = weight.size(1);
  TORCH_CHECK(N % 32 == 0 && K % kInputsPerStep == 0, "amx_pack_weight: out and in features must be multiples of 32");
  return weight.contiguous()
      .view({N / kOutputsPerBlock, kOutputsPerBlock, K / 2, 2})
      .permute({0, 2, 1, 3})
      .contiguous()
      .view({N / kOutputsPerBlock, K / 2, 2 * kOutputsPerBlock});
}

at::Tensor amx_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias) {
  const packed_weight::Call call = packed_weight::check_call("amx_linear", x, packed, bias);
  const int64_t M = call.M, K = call.K, N = call.N;
  auto out = at::empty({M, N}, x.options());
  if (M == 0) return out;  // an empty tile configuration would fault
#ifdef RAPID_LLM_HAS_AMX
  TORCH_CHECK(tile_state_granted(), "amx_linear: the kernel did not grant this process AMX tile state");
  const at::Tensor bias_fp32 = packed_weight::bias_as_fp32(bias);
  const float* bias_data = bias_fp32.defined() ? bias_fp32.data_ptr<float>() : nullptr;
  const auto* x_data = x.data_ptr<at::BFloat16>();
  const auto* weight = packed.data_ptr<at::BFloat16>();
  auto* out_data = out.data_ptr<at::BFloat16>();
  if (M == 1) {
    one_row_linear(x_data, K, weight, N, bias_data, out_data);
  } else if (M <= kRowsPerTile) {
    few_rows_linear(x_data, M, K, weight, N, bias_data, out_data);
  } else {
    many_rows_linear(x_data, M, K, weight, N, bias_data, out_data);
  }
  return out;
#else
  TORCH_CHECK(false, "amx_linear: this build has no AMX-BF16 / AVX512-BF16 code (the CPU lacks them)");
  return out;
#endif
}
