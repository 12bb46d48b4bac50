// The `lora` op for decode-sized calls on CPU (ops/cpp/cpu_lora.py): out[t] += (x[t] A[s]^T) B[s]^T for every
// token t of a present adapter slot s, read from the step's slot grouping (slot_starts, sorted_tokens). Two
// passes, each one parallel loop: the shrink dots every token of a slot with 4 rows of A at a time (x rows and A
// rows both contiguous along `in`: AVX-512 BF16 dot products on bf16, fp32 FMAs otherwise), into an fp32 buffer
// [tokens, W] that is never rounded; the expand takes 16 output rows at a time, transposes their B[s] block
// (16 x W) once into an fp32 tile [W][16] in registers (16 x 16 dword transposes; a bf16 pair per dword), and
// then every token of the slot is 16 outputs per FMA over that tile, added into out with one rounding (bf16 by
// the same round-to-nearest-even bit arithmetic as bf16_bits.h, NaN included). So A and B are read once per call
// and nothing is converted but what is loaded. Built with AVX-512 F/BW/VL (-march=native on such a CPU; BF16 dot
// products where avx512_bf16 is there too); elsewhere plain loops compute the same sums (`lora_kernel()` says
// which). Rows of out whose token has no adapter are not touched.
// The `lora` op on CPU (ops/cpp/cpu_lora.py): out[t] += (x[t] A[s]^T) B[s]^T for every token t of a present
// adapter slot s, from the step's slot grouping (slot_starts, sorted_tokens), where the grouped form runs two small
// GEMMs per slot and converts A and B to fp32 each call. Two passes, one parallel loop each. The shrink dots up to
// 4 tokens of a slot with 4 rows of A at a time along `in` (AVX-512 BF16 dot products on bf16, fp32 FMAs
// otherwise) into an fp32 buffer [tokens, W], never rounded. The expand takes 16 output rows at a time: each 32
// (bf16; else 16) columns of their B[s] block are transposed in registers (a 16 x 16 dword transpose, a bf16 pair
// per dword), so that one FMA adds a column into 16 outputs of a token, for up to 8 tokens per pass; the sums
// are added into out with one rounding (bf16: round to nearest even by bit arithmetic, as bf16_bits.h, NaN
// included). 16-column groups of B that are zero in all 16 rows are skipped: a merged projection's B is
// block-diagonal (q rows are zero in k's and v's columns) and smaller ranks are zero-padded; exact, but for a
// non-finite shrink sum times such a zero (NaN in the reference). So A and B are read once per call, nothing is
// converted but what is loaded, and rows of out without an adapter are not touched. Built with AVX-512 F/BW/VL
// (-march=native on such a CPU; the BF16 dot products where avx512_bf16 is there too); elsewhere plain loops
// compute the same sums. `lora_kernel()` says which.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define RAPID_LLM_LORA_AVX512 1
#include <immintrin.h>
#endif

namespace {

// Below this many multiply-adds per thread a pass runs on the calling thread (waking the pool costs more).
constexpr int64_t kMinParallelMacs = 1 << 17;
constexpr int64_t kRowsPerGroup = 4;  // A rows per shrink task
constexpr int64_t kBlock = 16;        // output rows per expand task (one vector)

// The call, with the grouping read once: slots[i] is a slot with tokens, sorted_tokens[begins[i], ends[i]).
struct Call {
  int64_t in, width, out;
  int64_t x_stride, out_stride;
  const int64_t* tokens;  // sorted_tokens
  std::vector<int64_t> slots, begins, ends;
  int64_t grouped;  // tokens with a slot (the shrink buffer's rows)
};

// Work-based grain: tasks per chunk so that a chunk has at least kMinParallelMacs multiply-adds.
int64_t grain_for(int64_t macs_per_task) {
  return std::max<int64_t>(1, kMinParallelMacs / std::max<int64_t>(1, macs_per_task));
}

#ifdef RAPID_LLM_LORA_AVX512

constexpr int kMaxShrinkTokens = 4;  // 4 A rows x 4 tokens = 16 accumulators
constexpr int kMaxExpandTokens = 8;

inline __mmask16 mask16(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
}
inline __mmask32 mask32(int64_t n) {
  return n >= 32 ? static_cast<__mmask32>(0xFFFFFFFFu) : static_cast<__mmask32>((1u << n) - 1);
}

// 16 values (masked lanes zero) widened to fp32, and fp32 narrowed back with one round to nearest even.
inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load16(const at::BFloat16* p, __mmask16 m) {
  const __m512i words = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(words, 16));
}
inline __m512 load16(const at::Half* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }

// A whole vector is stored unmasked: masked stores are slow on some CPUs (AMD Zen 4).
inline void store16(float* p, __m512 v, __mmask16 m) {
  if (m == 0xFFFF) {
    _mm512_storeu_ps(p, v);
  } else {
    _mm512_mask_storeu_ps(p, m, v);
  }
}
inline void store_words(void* p, __m256i words, __mmask16 m) {
  if (m == 0xFFFF) {
    _mm256_storeu_si256(static_cast<__m256i*>(p), words);
  } else {
    _mm256_mask_storeu_epi16(p, m, words);
  }
}
inline void store16(at::BFloat16* p, __m512 v, __mmask16 m) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  rounded = _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  store_words(p, _mm512_cvtepi32_epi16(rounded), m);
}
inline void store16(at::Half* p, __m512 v, __mmask16 m) {
  store_words(p, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), m);
}

// The shrink's arithmetic: fp32 FMAs over 16 values widened to fp32, or on bf16 with AVX-512 BF16, dot products
// of 32 values (exact bf16 x bf16 products summed in fp32; denormals flushed, as the instruction does).
template <typename scalar_t>
struct ShrinkMath {
  static constexpr int64_t kWidth = 16;
  using Vector = __m512;
  static Vector load(const scalar_t* p, int64_t n) { return load16(p, mask16(n)); }
  static __m512 multiply_add(__m512 acc, Vector a, Vector b) { return _mm512_fmadd_ps(a, b, acc); }
};
#ifdef __AVX512BF16__
template <>
struct ShrinkMath<at::BFloat16> {
  static constexpr int64_t kWidth = 32;
  using Vector = __m512bh;
  static Vector load(const at::BFloat16* p, int64_t n) { return (__m512bh)_mm512_maskz_loadu_epi16(mask32(n), p); }
  static __m512 multiply_add(__m512 acc, Vector a, Vector b) { return _mm512_dpbf16_ps(acc, a, b); }
};
#endif

// Shrink: sums[t][r] = x[t] . a[r] for TOKENS rows of x and the first `rows` of 4 rows of A.
template <typename scalar_t, int TOKENS>
void shrink_tile(const scalar_t* const* a, const scalar_t* const* x, int64_t in, float* const* sums, int rows) {
  using Math = ShrinkMath<scalar_t>;
  __m512 acc[kRowsPerGroup][TOKENS];
  for (auto& row : acc)
    for (auto& value : row) value = _mm512_setzero_ps();
  for (int64_t k = 0; k < in; k += Math::kWidth) {
    typename Math::Vector xv[TOKENS];
    for (int t = 0; t < TOKENS; ++t) xv[t] = Math::load(x[t] + k, in - k);
    for (int r = 0; r < kRowsPerGroup; ++r) {
      const typename Math::Vector av = Math::load(a[r] + k, in - k);
      for (int t = 0; t < TOKENS; ++t) acc[r][t] = Math::multiply_add(acc[r][t], av, xv[t]);
    }
  }
  for (int r = 0; r < rows; ++r)
    for (int t = 0; t < TOKENS; ++t) sums[t][r] = _mm512_reduce_add_ps(acc[r][t]);
}

template <typename scalar_t>
using ShrinkTile = void (*)(const scalar_t* const*, const scalar_t* const*, int64_t, float* const*, int);

template <typename scalar_t, int... Tokens>
constexpr std::array<ShrinkTile<scalar_t>, sizeof...(Tokens)> shrink_tiles(std::integer_sequence<int, Tokens...>) {
  return {shrink_tile<scalar_t, Tokens + 1>...};
}

// A 16 x 16 matrix of dwords transposed in registers: rows[i] lane c becomes rows[c] lane i.
inline void transpose16(__m512i rows[16]) {
  __m512i pairs[16], quads[16];
  for (int i = 0; i < 16; i += 2) {  // in each 128-bit lane: (row i, row i+1) interleaved
    pairs[i] = _mm512_unpacklo_epi32(rows[i], rows[i + 1]);
    pairs[i + 1] = _mm512_unpackhi_epi32(rows[i], rows[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // quads[i + c]: lane L holds column 4L + c of rows i .. i+3
    quads[i] = _mm512_unpacklo_epi64(pairs[i], pairs[i + 2]);
    quads[i + 1] = _mm512_unpackhi_epi64(pairs[i], pairs[i + 2]);
    quads[i + 2] = _mm512_unpacklo_epi64(pairs[i + 1], pairs[i + 3]);
    quads[i + 3] = _mm512_unpackhi_epi64(pairs[i + 1], pairs[i + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // the 4 x 4 matrix of 128-bit lanes quads[4g + c].lane L, transposed
    const __m512i low01 = _mm512_shuffle_i32x4(quads[c], quads[4 + c], 0x88);
    const __m512i high01 = _mm512_shuffle_i32x4(quads[c], quads[4 + c], 0xDD);
    const __m512i low23 = _mm512_shuffle_i32x4(quads[8 + c], quads[12 + c], 0x88);
    const __m512i high23 = _mm512_shuffle_i32x4(quads[8 + c], quads[12 + c], 0xDD);
    rows[c] = _mm512_shuffle_i32x4(low01, low23, 0x88);
    rows[4 + c] = _mm512_shuffle_i32x4(high01, high23, 0x88);
    rows[8 + c] = _mm512_shuffle_i32x4(low01, low23, 0xDD);
    rows[12 + c] = _mm512_shuffle_i32x4(high01, high23, 0xDD);
  }
}

// Columns of B per transpose: 32 bf16 (a pair per dword), else 16.
template <typename scalar_t>
constexpr int kChunk = std::is_same_v<scalar_t, at::BFloat16> ? 32 : 16;

// Loads the 16 x kChunk block of B at columns r0.. into lines (rows past `rows`, columns past width zero) and
// says which of its 16-column groups have a nonzero value (bit g: columns r0 + 16g ..).
inline unsigned load_block(const at::BFloat16* b, int64_t width, int64_t rows, int64_t r0, __m512i lines[16]) {
  __m512i any = _mm512_setzero_si512();
  for (int64_t i = 0; i < 16; ++i) {
    lines[i] = _mm512_maskz_loadu_epi16(i < rows ? mask32(width - r0) : 0, b + i * width + r0);
    any = _mm512_or_si512(any, lines[i]);
  }
  const __mmask32 nonzero = _mm512_test_epi16_mask(any, _mm512_set1_epi16(0x7FFF));  // -0 is zero too
  return ((nonzero & 0xFFFFu) ? 1u : 0u) | ((nonzero >> 16) ? 2u : 0u);
}
template <typename scalar_t>
inline unsigned load_block(const scalar_t* b, int64_t width, int64_t rows, int64_t r0, __m512i lines[16]) {
  __m512i any = _mm512_setzero_si512();
  for (int64_t i = 0; i < 16; ++i) {
    lines[i] = _mm512_castps_si512(load16(b + i * width + r0, i < rows ? mask16(width - r0) : 0));
    any = _mm512_or_si512(any, lines[i]);
  }
  return _mm512_test_epi32_mask(any, _mm512_set1_epi32(0x7FFFFFFF)) ? 1u : 0u;
}

// Column c of a transposed block (lines[q] of a bf16 block: the pair of columns 2q, 2q + 1), 16 rows in fp32.
template <typename scalar_t>
inline __m512 column_of(const __m512i lines[16], int c) {
  if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
    return _mm512_castsi512_ps(c % 2 == 0 ? _mm512_slli_epi32(lines[c / 2], 16)
                                          : _mm512_and_si512(lines[c / 2], _mm512_set1_epi32(-65536)));
  } else {
    return _mm512_castsi512_ps(lines[c]);
  }
}

// acc[t] += columns FIRST .. FIRST + 15 of a transposed block times sums[t][r0 + column], in registers.
template <typename scalar_t, int TOKENS, int CHAINS, int FIRST>
__attribute__((always_inline)) inline void fma_columns(const __m512i lines[16], const float* const* sums, int64_t r0,
                                                       __m512 (&acc)[TOKENS][CHAINS]) {
#pragma GCC unroll 16
  for (int c = FIRST; c < FIRST + 16; ++c) {
    const __m512 column = column_of<scalar_t>(lines, c);
#pragma GCC unroll 8
    for (int t = 0; t < TOKENS; ++t)
      acc[t][c % CHAINS] = _mm512_fmadd_ps(column, _mm512_set1_ps(sums[t][r0 + c]), acc[t][c % CHAINS]);
  }
}

// Expand: out[token][16 columns] += B block (16 rows x width) . sums[token] for TOKENS tokens, one rounding into
// out. Each chunk of B is transposed in registers and used there; a token has several accumulator chains when
// there are few tokens, so that FMA latency does not bound the loop. 16-column groups of B that are zero in all
// 16 rows are skipped (a merged projection's B is block-diagonal: q rows are zero in k's and v's columns, and
// ranks below the largest are zero-padded); exact, but for a non-finite shrink result times such a zero.
template <typename scalar_t, int TOKENS>
void expand_tile(const scalar_t* b, int64_t width, int64_t rows, const float* const* sums, scalar_t* const* out) {
  constexpr int chunk = kChunk<scalar_t>, chains = TOKENS == 1 ? 4 : TOKENS <= 3 ? 2 : 1;
  __m512 acc[TOKENS][chains];
  for (auto& token : acc)
    for (auto& value : token) value = _mm512_setzero_ps();
  __m512i lines[16];
  int64_t r0 = 0;
  for (; r0 + chunk <= width; r0 += chunk) {
    const unsigned groups = load_block(b, width, rows, r0, lines);
    if (groups == 0) continue;
    transpose16(lines);
    if (groups & 1u) fma_columns<scalar_t, TOKENS, chains, 0>(lines, sums, r0, acc);
    if constexpr (chunk == 32) {
      if (groups & 2u) fma_columns<scalar_t, TOKENS, chains, 16>(lines, sums, r0, acc);
    }
  }
  const unsigned groups = r0 < width ? load_block(b, width, rows, r0, lines) : 0u;
  if (groups != 0) {  // a last, partial chunk, through a tile in memory
    transpose16(lines);
    alignas(64) float tile[chunk][kBlock];
#pragma GCC unroll 32
    for (int c = 0; c < chunk; ++c) _mm512_store_ps(tile[c], column_of<scalar_t>(lines, c));
    for (int64_t c = 0; c < width - r0; c += chains) {  // past width: zero columns times zero
      if (!((groups >> (c / 16)) & 1u)) continue;
#pragma GCC unroll 4
      for (int chain = 0; chain < chains; ++chain) {
        const __m512 column = _mm512_load_ps(tile[c + chain]);
        for (int t = 0; t < TOKENS; ++t) {
          const float sum = c + chain < width - r0 ? sums[t][r0 + c + chain] : 0.f;
          acc[t][chain] = _mm512_fmadd_ps(column, _mm512_set1_ps(sum), acc[t][chain]);
        }
      }
    }
  }
  const __mmask16 m = mask16(rows);
  for (int t = 0; t < TOKENS; ++t) {
    __m512 delta = acc[t][0];
    for (int chain = 1; chain < chains; ++chain) delta = _mm512_add_ps(delta, acc[t][chain]);
    store16(out[t], _mm512_add_ps(load16(out[t], m), delta), m);
  }
}

template <typename scalar_t>
using ExpandTile = void (*)(const scalar_t*, int64_t, int64_t, const float* const*, scalar_t* const*);

template <typename scalar_t, int... Tokens>
constexpr std::array<ExpandTile<scalar_t>, sizeof...(Tokens)> expand_tiles(std::integer_sequence<int, Tokens...>) {
  return {expand_tile<scalar_t, Tokens + 1>...};
}

template <typename scalar_t>
void run(const Call& call, const scalar_t* x, const scalar_t* lora_a, const scalar_t* lora_b, scalar_t* out,
         float* sums) {
  static constexpr auto shrinks = shrink_tiles<scalar_t>(std::make_integer_sequence<int, kMaxShrinkTokens>{});
  static constexpr auto expands = expand_tiles<scalar_t>(std::make_integer_sequence<int, kMaxExpandTokens>{});
  const int64_t in = call.in, width = call.width, present = static_cast<int64_t>(call.slots.size());
  const int64_t groups = (width + kRowsPerGroup - 1) / kRowsPerGroup;
  // sums row p (p-th token of the sorted order) is the shrink of token tokens[p] by its slot's A.
  at::parallel_for(0, present * groups, grain_for(kRowsPerGroup * in * call.grouped / present),
                   [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t index = task / groups, first_row = task % groups * kRowsPerGroup;
      const int rows = static_cast<int>(std::min(kRowsPerGroup, width - first_row));
      const scalar_t* a[kRowsPerGroup];
      for (int r = 0; r < kRowsPerGroup; ++r)  // a short last group repeats its last row (its sums unused)
        a[r] = lora_a + (call.slots[index] * width + first_row + std::min(r, rows - 1)) * in;
      for (int64_t p = call.begins[index]; p < call.ends[index]; p += kMaxShrinkTokens) {
        const int count = static_cast<int>(std::min<int64_t>(kMaxShrinkTokens, call.ends[index] - p));
        const scalar_t* rows_x[kMaxShrinkTokens];
        float* rows_sums[kMaxShrinkTokens];
        for (int t = 0; t < count; ++t) {
          rows_x[t] = x + call.tokens[p + t] * call.x_stride;
          rows_sums[t] = sums + (p + t) * width + first_row;
        }
        shrinks[count - 1](a, rows_x, in, rows_sums, rows);
      }
    }
  });
  const int64_t blocks = (call.out + kBlock - 1) / kBlock;
  at::parallel_for(0, blocks, grain_for(kBlock * width * call.grouped), [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const int64_t first = block * kBlock, rows = std::min(kBlock, call.out - first);
      for (int64_t index = 0; index < present; ++index) {
        const scalar_t* b = lora_b + (call.slots[index] * call.out + first) * width;
        for (int64_t p = call.begins[index]; p < call.ends[index]; p += kMaxExpandTokens) {
          const int count = static_cast<int>(std::min<int64_t>(kMaxExpandTokens, call.ends[index] - p));
          const float* rows_sums[kMaxExpandTokens];
          scalar_t* rows_out[kMaxExpandTokens];
          for (int t = 0; t < count; ++t) {
            rows_sums[t] = sums + (p + t) * width;
            rows_out[t] = out + call.tokens[p + t] * call.out_stride + first;
          }
          expands[count - 1](b, width, rows, rows_sums, rows_out);
        }
      }
    }
  });
}

#else  // plain loops: the same sums, in another order

template <typename scalar_t>
void run(const Call& call, const scalar_t* x, const scalar_t* lora_a, const scalar_t* lora_b, scalar_t* out,
         float* sums) {
  const int64_t in = call.in, width = call.width, present = static_cast<int64_t>(call.slots.size());
  at::parallel_for(0, present * width, grain_for(in * call.grouped / present), [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t index = task / width, row = task % width;
      const scalar_t* a = lora_a + (call.slots[index] * width + row) * in;
      for (int64_t p = call.begins[index]; p < call.ends[index]; ++p) {
        const scalar_t* xs = x + call.tokens[p] * call.x_stride;
        float sum = 0.f;
        for (int64_t k = 0; k < in; ++k) sum += static_cast<float>(xs[k]) * static_cast<float>(a[k]);
        sums[p * width + row] = sum;
      }
    }
  });
  at::parallel_for(0, call.out, grain_for(width * call.grouped), [&](int64_t begin, int64_t end) {
    std::vector<float> b_row(width);
    for (int64_t j = begin; j < end; ++j) {
      for (int64_t index = 0; index < present; ++index) {
        const scalar_t* b = lora_b + (call.slots[index] * call.out + j) * width;
        for (int64_t r = 0; r < width; ++r) b_row[r] = static_cast<float>(b[r]);
        for (int64_t p = call.begins[index]; p < call.ends[index]; ++p) {
          const float* s = sums + p * width;
          float sum = 0.f;
          for (int64_t r = 0; r < width; ++r) sum += b_row[r] * s[r];
          scalar_t& target = out[call.tokens[p] * call.out_stride + j];
          target = static_cast<scalar_t>(static_cast<float>(target) + sum);
        }
      }
    }
  });
}

#endif  // RAPID_LLM_LORA_AVX512

}  // namespace

std::string lora_kernel() {
#if defined(RAPID_LLM_LORA_AVX512) && defined(__AVX512BF16__)
  return "avx512_bf16";
#elif defined(RAPID_LLM_LORA_AVX512)
  return "avx512";
#else
  return "scalar";
#endif
}

// x [T, in] and out [T, out] with unit column stride (rows strided), lora_a [L, W, in] and lora_b [L, out, W]
// contiguous, one dtype; slot_starts [L + 1] and sorted_tokens [T] int64 as lora_indices builds them.
void lora(const at::Tensor& x, const at::Tensor& lora_a, const at::Tensor& lora_b, const at::Tensor& slot_starts,
          const at::Tensor& sorted_tokens, at::Tensor out) {
  const std::initializer_list<const at::Tensor*> tensors{&x, &lora_a, &lora_b, &slot_starts, &sorted_tokens, &out};
  for (const at::Tensor* tensor : tensors)
    TORCH_CHECK(tensor->device().is_cpu(), "lora: every tensor must be on the CPU");
  TORCH_CHECK(x.dim() == 2 && lora_a.dim() == 3 && lora_b.dim() == 3 && out.dim() == 2,
              "lora: x [T, in], lora_a [L, W, in], lora_b [L, out, W] and out [T, out] expected");
  const int64_t num_tokens = x.size(0), num_slots = lora_a.size(0);
  Call call{x.size(1), lora_a.size(1), lora_b.size(1), x.stride(0), out.stride(0), nullptr, {}, {}, {}, 0};
  TORCH_CHECK(lora_a.size(2) == call.in && lora_b.size(0) == num_slots && lora_b.size(2) == call.width &&
                  out.size(0) == num_tokens && out.size(1) == call.out,
              "lora: the shapes of x, lora_a, lora_b and out do not fit together");
  TORCH_CHECK(lora_a.scalar_type() == x.scalar_type() && lora_b.scalar_type() == x.scalar_type() &&
                  out.scalar_type() == x.scalar_type(),
              "lora: x, lora_a, lora_b and out must share one dtype");
  TORCH_CHECK((x.stride(1) == 1 || call.in <= 1) && (out.stride(1) == 1 || call.out <= 1) && lora_a.is_contiguous() &&
                  lora_b.is_contiguous(),
              "lora: x and out need unit column stride, lora_a and lora_b must be contiguous");
  TORCH_CHECK(slot_starts.scalar_type() == at::kLong && slot_starts.is_contiguous() &&
                  slot_starts.numel() == num_slots + 1 && sorted_tokens.scalar_type() == at::kLong &&
                  sorted_tokens.is_contiguous() && sorted_tokens.numel() == num_tokens,
              "lora: slot_starts [L + 1] and sorted_tokens [T] must be contiguous int64 (lora_indices)");
  const int64_t* starts = slot_starts.data_ptr<int64_t>();
  call.tokens = sorted_tokens.data_ptr<int64_t>();
  TORCH_CHECK(starts[0] == 0 && starts[num_slots] <= num_tokens, "lora: slot_starts out of range");
  for (int64_t slot = 0; slot < num_slots; ++slot) {
    TORCH_CHECK(starts[slot] <= starts[slot + 1], "lora: slot_starts must be ascending");
    if (starts[slot] < starts[slot + 1]) {
      call.slots.push_back(slot);
      call.begins.push_back(starts[slot]);
      call.ends.push_back(starts[slot + 1]);
    }
  }
  call.grouped = starts[num_slots];
  for (int64_t p = 0; p < call.grouped; ++p)
    TORCH_CHECK(call.tokens[p] >= 0 && call.tokens[p] < num_tokens, "lora: sorted_tokens out of range");
  if (call.grouped == 0 || call.width == 0 || call.out == 0) return;
  std::vector<float> sums(call.grouped * call.width);
  const auto dispatch = [&](auto* type) {
    using scalar_t = std::remove_pointer_t<decltype(type)>;
    run<scalar_t>(call, x.data_ptr<scalar_t>(), lora_a.data_ptr<scalar_t>(), lora_b.data_ptr<scalar_t>(),
                  out.data_ptr<scalar_t>(), sums.data());
  };
  switch (x.scalar_type()) {
    case at::kFloat: dispatch(static_cast<float*>(nullptr)); break;
    case at::kBFloat16: dispatch(static_cast<at::BFloat16*>(nullptr)); break;
    case at::kHalf: dispatch(static_cast<at::Half*>(nullptr)); break;
    default: TORCH_CHECK(false, "lora: fp32, bf16 or fp16 expected, got ", x.scalar_type());
  }
}
