// bf16 linear layers on AMX / AVX-512 BF16 CPUs over a weight packed once, for the `cpu_amx` kernel.
// The packed layout is [N/16][K/2][16][2]: per block of 16 outputs, per pair of inputs, the 16 outputs'
// two weights side by side. One 64-byte row of it is both an AVX-512 BF16 dot-product operand (one-row
// inputs: broadcast the input pair, 16 outputs per instruction, no horizontal sums) and a row of an AMX
// B tile (more rows: 16 x 32 x 16 products per tile instruction). The weight streams through once per
// call either way, and the fp32 sums are rounded to bf16 (plus bias) as each block finishes, so a call is
// one pass with no fp32 result tensor. `amx_silu_and_mul_linear` is the same pass over a merged [gate; up]
// weight whose epilogue pairs gate block b with up block b + N/32 and writes silu(gate) * up, rounded where the
// unfused linear and silu_and_mul round (bit-identical to them), so the MLP's widest output is never stored.
// On tiles, each unit's rounding runs inside the next unit's K loop (UnitStore), beside the tile products.
// Built only where the compiler targets AMX-BF16 and AVX512-BF16 (-march=native on such a CPU); elsewhere
// `amx_linear_supported()` is false and the kernel is skipped.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "amx_tiles.h"
#include "packed_weight.h"
#include "gated_epilogue.h"

#if defined(RAPID_LLM_HAS_AMX) && !defined(RAPID_LLM_HAS_SILU_BF16)
#error "amx_linear.cpp: every AMX target has AVX-512 BW/DQ/VL, which the gated epilogue needs"
#endif

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
  // GCC may sink the stores above past the intrinsic (it did once this file's callers were inlined differently);
  // ldtilecfg then reads a zero row width and faults.
  asm volatile("" ::: "memory");
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

// silu(gate) * up (gated_epilogue.h) for rows x 16 outputs from fp32 sums + bias; out (row stride out_stride)
// at column n, the gate's bias at bias[n] and the up's at bias[n + up_offset].
inline void store_gated_rows(const float* gate_sums, const float* up_sums, int64_t sums_stride, int rows,
                             const float* bias, int64_t n, int64_t up_offset, at::BFloat16* out, int64_t out_stride) {
  const __m512 gate_bias = bias ? _mm512_loadu_ps(bias + n) : _mm512_setzero_ps();
  const __m512 up_bias = bias ? _mm512_loadu_ps(bias + n + up_offset) : _mm512_setzero_ps();
  for (int row = 0; row < rows; ++row)
    gated_epilogue::store_16(_mm512_add_ps(_mm512_loadu_ps(gate_sums + row * sums_stride), gate_bias),
                             _mm512_add_ps(_mm512_loadu_ps(up_sums + row * sums_stride), up_bias),
                             out + row * out_stride + n);
}

// One input row, the BLOCKS blocks of 16 outputs `blocks` lists: a dot-product chain per block (independent
// chains hide the instruction's latency); the fp32 sums land in sums[BLOCKS][16].
template <int BLOCKS>
void one_row_sums(const at::BFloat16* x, int64_t K, const at::BFloat16* packed, const int64_t* blocks, float* sums) {
  __m512 chains[BLOCKS];
  for (int b = 0; b < BLOCKS; ++b) chains[b] = _mm512_setzero_ps();
  const uint32_t* input_pairs = reinterpret_cast<const uint32_t*>(x);
  for (int64_t pair = 0; pair < K / 2; ++pair) {
    const __m512bh input = (__m512bh)_mm512_set1_epi32(static_cast<int>(input_pairs[pair]));
    for (int b = 0; b < BLOCKS; ++b) {
      const at::BFloat16* row = pair_row(packed, K, blocks[b], pair);
      packed_weight::prefetch_ahead(row);
      chains[b] = _mm512_dpbf16_ps(chains[b], input, (__m512bh)_mm512_loadu_si512(row));
    }
  }
  for (int b = 0; b < BLOCKS; ++b) _mm512_storeu_ps(sums + b * kOutputsPerBlock, chains[b]);
}

// One input row: tasks of up to 4 output blocks (plain), or of up to 2 gate blocks with their up blocks (gated).
void one_row_linear(const at::BFloat16* x, int64_t K, const at::BFloat16* packed, int64_t N, const float* bias,
                    at::BFloat16* out, bool gated) {
  const int64_t per_task = gated ? 2 : 4;
  const int64_t outputs = gated ? N / 2 : N, blocks = outputs / kOutputsPerBlock, gate_blocks = N / 32;
  const int64_t tasks = (blocks + per_task - 1) / per_task;
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    alignas(64) float sums[4 * kOutputsPerBlock];
    int64_t task_blocks[4];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t first = task * per_task, count = std::min(per_task, blocks - first);
      for (int64_t b = 0; b < count; ++b) {
        task_blocks[b] = first + b;
        if (gated) task_blocks[count + b] = first + b + gate_blocks;
      }
      switch (gated ? 2 * count : count) {
        case 1: one_row_sums<1>(x, K, packed, task_blocks, sums); break;
        case 2: one_row_sums<2>(x, K, packed, task_blocks, sums); break;
        case 3: one_row_sums<3>(x, K, packed, task_blocks, sums); break;
        default: one_row_sums<4>(x, K, packed, task_blocks, sums); break;
      }
      for (int64_t b = 0; b < count; ++b) {
        const int64_t n = (first + b) * kOutputsPerBlock;
        if (gated)
          store_gated_rows(sums + b * kOutputsPerBlock, sums + (count + b) * kOutputsPerBlock, 0, 1, bias, n, N / 2,
                           out, outputs);
        else
          store_rows(sums + b * kOutputsPerBlock, kOutputsPerBlock, 1, bias, n, out, N);
      }
    }
  });
}

// A finished unit's epilogue: its fp32 sums rounded (plus bias, or silu(gate) * up for a gated task) into `out`,
// rows at a time. The next unit's K loop calls it between its tile products, so the vector units round while the
// AMX unit computes instead of the two taking turns.
struct UnitStore {
  const float* sums = nullptr;  // [32][32], row stride 32; nullptr: nothing pending
  int rows = 0, done = 0;
  const float* bias = nullptr;
  int64_t task = 0, N = 0;
  bool gated = false;
  at::BFloat16* out = nullptr;  // the unit's first row; row stride N (plain) or N / 2 (gated)

  void store_until(int row_end) {
    const int end = std::min(row_end, rows);
    if (sums == nullptr || end <= done) return;
    const float* first = sums + done * 32;
    if (gated) {
      store_gated_rows(first, first + kOutputsPerBlock, 32, end - done, bias, task * kOutputsPerBlock, N / 2,
                       out + done * (N / 2), N / 2);
    } else {
      for (int side = 0; side < 2; ++side)
        store_rows(first + side * kOutputsPerBlock, 32, end - done, bias, (2 * task + side) * kOutputsPerBlock,
                   out + done * N, N);
    }
    done = end;
  }
};

// Sums for `rows` (<= 16 with one input tile, else 32 with two) x 32 outputs, output blocks `left` and `right`
// side by side, over all of K; rows are contiguous with stride K, the sums land in sums[32][32] (row stride 32).
// `previous` is stored meanwhile (all of it by the end).
template <bool TWO_INPUT_TILES>
void tile_block(const at::BFloat16* x, int64_t K, const at::BFloat16* packed, int64_t left, int64_t right,
                float* sums, UnitStore& previous) {
  _tile_zero(0);
  _tile_zero(1);
  if (TWO_INPUT_TILES) {
    _tile_zero(2);
    _tile_zero(3);
  }
  const int64_t steps = K / kInputsPerStep;
  const int rows_per_step = static_cast<int>((previous.rows + steps - 1) / steps);
  for (int64_t step = 0, k = 0; k < K; ++step, k += kInputsPerStep) {
    _tile_loadd(4, x + k, K * 2);
    _tile_loadd(6, pair_row(packed, K, left, k / 2), 64);
    _tile_loadd(7, pair_row(packed, K, right, k / 2), 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (TWO_INPUT_TILES) {
      _tile_loadd(5, x + kRowsPerTile * K + k, K * 2);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    previous.store_until(static_cast<int>(step + 1) * rows_per_step);
  }
  previous.store_until(previous.rows);
  constexpr int64_t stride = 2 * kOutputsPerBlock * 4;  // bytes per sums row
  _tile_stored(0, sums, stride);
  _tile_stored(1, sums + kOutputsPerBlock, stride);
  if (TWO_INPUT_TILES) {
    _tile_stored(2, sums + kRowsPerTile * 32, stride);
    _tile_stored(3, sums + kRowsPerTile * 32 + kOutputsPerBlock, stride);
  }
}

// Units of one thread, each `rows` rows of x against task `task` (plain: output blocks 2 task and 2 task + 1;
// gated: gate block `task` and its up block task + N / 32), stored at out (row stride: the outputs); each unit's
// epilogue runs during the next one's products (UnitStore), the last one's at the end.
template <bool TWO_INPUT_TILES>
class UnitPipeline {
 public:
  UnitPipeline(int64_t K, const at::BFloat16* packed, int64_t N, const float* bias, bool gated)
      : K_(K), packed_(packed), N_(N), bias_(bias), gated_(gated) {}

  void run(const at::BFloat16* x, int64_t rows, int64_t task, at::BFloat16* out) {
    const int64_t tasks = N_ / 32;
    float* sums = sums_[next_buffer_];
    tile_block<TWO_INPUT_TILES>(x, K_, packed_, gated_ ? task : 2 * task, gated_ ? task + tasks : 2 * task + 1,
                                sums, pending_);
    pending_ = UnitStore{sums, static_cast<int>(rows), 0, bias_, task, N_, gated_, out};
    next_buffer_ ^= 1;
  }

  ~UnitPipeline() { pending_.store_until(pending_.rows); }

 private:
  int64_t K_;
  const at::BFloat16* packed_;
  int64_t N_;
  const float* bias_;
  bool gated_;
  alignas(64) float sums_[2][32 * 32];
  int next_buffer_ = 0;
  UnitStore pending_;
};

// Up to 16 rows: one input tile of exactly those rows, tasks over pairs of output blocks.
void few_rows_linear(const at::BFloat16* x, int64_t M, int64_t K, const at::BFloat16* packed, int64_t N,
                     const float* bias, at::BFloat16* out, bool gated) {
  at::parallel_for(0, N / 32, 1, [&](int64_t begin, int64_t end) {
    configure_tiles(static_cast<int>(M));
    {
      UnitPipeline<false> units(K, packed, N, bias, gated);
      for (int64_t task = begin; task < end; ++task) units.run(x, M, task, out);
    }
    _tile_release();
  });
}

// More rows: 32-row blocks (the last one copied into a zero-padded buffer), grouped in panels of 256
// rows that stay in cache while every output block's weights pass once per panel.
void many_rows_linear(const at::BFloat16* x, int64_t M, int64_t K, const at::BFloat16* packed, int64_t N,
                      const float* bias, at::BFloat16* out, bool gated) {
  constexpr int64_t kPanelRows = 256;
  const int64_t full_rows = M / 32 * 32, out_stride = gated ? N / 2 : N;
  std::vector<at::BFloat16> tail(full_rows < M ? 32 * K : 0, at::BFloat16(0.0f));
  if (full_rows < M) std::memcpy(tail.data(), x + full_rows * K, (M - full_rows) * K * sizeof(at::BFloat16));
  for (int64_t panel = 0; panel < M; panel += kPanelRows) {
    const int64_t panel_end = std::min(M, panel + kPanelRows);
    at::parallel_for(0, N / 32, 1, [&](int64_t begin, int64_t end) {
      configure_tiles(kRowsPerTile);
      {
        UnitPipeline<true> units(K, packed, N, bias, gated);
        for (int64_t task = begin; task < end; ++task)
          for (int64_t row = panel; row < panel_end; row += 32)
            units.run(row >= full_rows ? tail.data() : x + row * K, std::min<int64_t>(32, M - row), task,
                      out + row * out_stride);
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

namespace {

// x W^T + b (gated: silu of the first half of the outputs times the second half) into a new [M, N or N / 2].
at::Tensor run_packed(const char* op, const at::Tensor& x, const at::Tensor& packed,
                      const c10::optional<at::Tensor>& bias, bool gated) {
  const packed_weight::Call call = packed_weight::check_call(op, x, packed, bias);
  const int64_t M = call.M, K = call.K, N = call.N;
  auto out = at::empty({M, gated ? N / 2 : N}, x.options());
  if (M == 0) return out;  // an empty tile configuration would fault
#ifdef RAPID_LLM_HAS_AMX
  TORCH_CHECK(tile_state_granted(), op, ": the kernel did not grant this process AMX tile state");
  const at::Tensor bias_fp32 = packed_weight::bias_as_fp32(bias);
  const float* bias_data = bias_fp32.defined() ? bias_fp32.data_ptr<float>() : nullptr;
  const auto* x_data = x.data_ptr<at::BFloat16>();
  const auto* weight = packed.data_ptr<at::BFloat16>();
  auto* out_data = out.data_ptr<at::BFloat16>();
  if (M == 1) {
    one_row_linear(x_data, K, weight, N, bias_data, out_data, gated);
  } else if (M <= kRowsPerTile) {
    few_rows_linear(x_data, M, K, weight, N, bias_data, out_data, gated);
  } else {
    many_rows_linear(x_data, M, K, weight, N, bias_data, out_data, gated);
  }
  return out;
#else
  TORCH_CHECK(false, op, ": this build has no AMX-BF16 / AVX512-BF16 code (the CPU lacks them)");
  return out;
#endif
}

}  // namespace

at::Tensor amx_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias) {
  return run_packed("amx_linear", x, packed, bias, false);
}

at::Tensor amx_silu_and_mul_linear(const at::Tensor& x, const at::Tensor& packed,
                                   const c10::optional<at::Tensor>& bias) {
  return run_packed("amx_silu_and_mul_linear", x, packed, bias, true);
}
