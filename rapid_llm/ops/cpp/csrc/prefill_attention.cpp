// Tiled causal attention for long prompt chunks over the paged KV cache, on AVX-512 BF16 CPUs (flash
// attention's scheme: query tiles against key tiles with an online softmax, so the cost is the causal
// triangle, not the padded rectangle). A work item is (sequence, kv head, tile of query tokens); its rows
// are the tile's tokens x the kv head's group of query heads, which share every key and value tile. First
// every (sequence, kv head, tile of 64 keys) is packed once, read through the block table (an fp8 cache is
// widened and scaled here): K as pairs of dims ([D/2][64] 32-bit words), V as pairs of keys ([32][D]).
// Then the items compute scores and the P·V update with one AVX-512 BF16 dot-product instruction per 16
// outputs and pair, fp32 accumulation, probabilities rounded to bf16 (as GPU flash attention rounds them to
// the input dtype). Where AMX is asked for and granted, its own form (prefill_attention_amx.h, with its own
// packed layouts) computes the items instead. Both phases run on all threads; items most expensive first (the
// last query tiles see the most keys).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>

#include "paged_attention_bf16.h"
#include "prefill_attention_amx.h"
#include "prefill_tiles.h"

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#ifdef RAPID_LLM_HAS_AVX512_BF16_ATTENTION

#include <omp.h>

namespace {

using paged_kernels::Layout;
using prefill_tiles::exp_of_nonpositive_16;
using prefill_tiles::kKeyTile;
using prefill_tiles::PrefillItem;
using prefill_tiles::to_bf16_bits;

constexpr int64_t kScoreVectors = kKeyTile / 16;
constexpr int64_t kRowsPerItem = 128;  // query rows (token x group head) an item aims for
constexpr int64_t kRowsPerAmxItem = 64;  // the AMX form's: its item buffers then fit in L1 beside the K/V tile

// K rows [first, first + count) of a kv head as dim pairs: packed[p * 64 + j] = (k_j[2p], k_j[2p + 1]);
// keys past `count` are zero.
template <typename C, int D>
void pack_keys(const C* keys, const int64_t* block_table, const Layout& L, int64_t first, int64_t count,
               float scale, uint32_t* packed) {
  std::fill(packed, packed + (D / 2) * kKeyTile, 0u);
  for (int64_t j = 0; j < count; ++j) {
    const C* row = prefill_tiles::cache_row(keys, block_table, L, first + j);
    for (int p = 0; p < D / 2; ++p)
      packed[p * kKeyTile + j] = static_cast<uint32_t>(to_bf16_bits(row[2 * p], scale)) |
                                 (static_cast<uint32_t>(to_bf16_bits(row[2 * p + 1], scale)) << 16);
  }
}

// V rows as key pairs: packed[i * D + d] = (v_{2i}[d], v_{2i+1}[d]); keys past `count` are zero.
template <typename C, int D>
void pack_values(const C* values, const int64_t* block_table, const Layout& L, int64_t first, int64_t count,
                 float scale, uint32_t* packed) {
  std::fill(packed, packed + (kKeyTile / 2) * D, 0u);
  uint16_t* halves = reinterpret_cast<uint16_t*>(packed);
  for (int64_t j = 0; j < count; ++j) {
    const C* row = prefill_tiles::cache_row(values, block_table, L, first + j);
    uint16_t* dst = halves + (j / 2) * 2 * D + (j % 2);
    for (int d = 0; d < D; ++d) dst[2 * d] = to_bf16_bits(row[d], scale);
  }
}

// scores[r][0, 64) = q_r . k_j for R rows; q_rows[r] points at row r's query (D bf16).
template <int D, int R>
inline void score_rows(const uint32_t* const* q_rows, const uint32_t* packed_keys, float* scores) {
  __m512 acc[R][kScoreVectors];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kScoreVectors; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int p = 0; p < D / 2; ++p) {
    __m512bh keys[kScoreVectors];
    for (int c = 0; c < kScoreVectors; ++c)
      keys[c] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(packed_keys + p * kKeyTile + 16 * c));
    for (int r = 0; r < R; ++r) {
      const __m512bh q = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(q_rows[r][p])));
      for (int c = 0; c < kScoreVectors; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], keys[c], q);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kScoreVectors; ++c) _mm512_storeu_ps(scores + r * kKeyTile + 16 * c, acc[r][c]);
}

// acc[r][0, D) += P_r . V over the tile's key pairs [0, pairs), for R rows.
template <int D, int R>
inline void accumulate_rows(const uint32_t* probabilities, const uint32_t* packed_values, int64_t pairs, float* acc) {
  constexpr int kVectors = D / 16;
  __m512 out[R][kVectors];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kVectors; ++c) out[r][c] = _mm512_loadu_ps(acc + r * D + 16 * c);
  for (int64_t i = 0; i < pairs; ++i) {
    __m512bh p[R];
    for (int r = 0; r < R; ++r)
      p[r] = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(probabilities[r * (kKeyTile / 2) + i])));
    for (int c = 0; c < kVectors; ++c) {
      const __m512bh v = reinterpret_cast<__m512bh>(_mm512_loadu_si512(packed_values + i * D + 16 * c));
      for (int r = 0; r < R; ++r) out[r][c] = _mm512_dpbf16_ps(out[r][c], v, p[r]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kVectors; ++c) _mm512_storeu_ps(acc + r * D + 16 * c, out[r][c]);
}

// Scales row `r`'s dot products into scores, masks them (causal, sliding window, keys past the tile), folds
// them into its running max and sums (kept per lane, 16 a row, totalled once at the end), rescales its
// accumulator and writes its probabilities as bf16 pairs.
template <int D>
inline void softmax_row(const float* dots, float scale, int64_t key_first, int64_t count, int64_t query_position,
                        int64_t window, bool masked, float& running_max, float* running_sums, float* acc,
                        uint32_t* probabilities) {
  __m512 s[kScoreVectors];
  for (int c = 0; c < kScoreVectors; ++c) s[c] = _mm512_mul_ps(_mm512_loadu_ps(dots + 16 * c), _mm512_set1_ps(scale));
  if (masked) {
    // Key key_first + i is kept when it exists, is not after the query and is in the window: i in [low, high],
    // both clamped to [-1, kKeyTile] so they fit the 32-bit lanes.
    const int64_t high = std::min(query_position, key_first + count - 1) - key_first;
    const int64_t low = window > 0 ? query_position - window + 1 - key_first : -1;
    const __m512i high_vector = _mm512_set1_epi32(static_cast<int>(std::clamp<int64_t>(high, -1, kKeyTile)));
    const __m512i low_vector = _mm512_set1_epi32(static_cast<int>(std::clamp<int64_t>(low, -1, kKeyTile)));
    const __m512i lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int c = 0; c < kScoreVectors; ++c) {
      const __m512i key = _mm512_add_epi32(lanes, _mm512_set1_epi32(16 * c));
      const __mmask16 keep = _mm512_cmple_epi32_mask(key, high_vector) & _mm512_cmpge_epi32_mask(key, low_vector);
      s[c] = _mm512_mask_blend_ps(keep, _mm512_set1_ps(-std::numeric_limits<float>::infinity()), s[c]);
    }
  }
  __m512 tile_max = s[0];
  for (int c = 1; c < kScoreVectors; ++c) tile_max = _mm512_max_ps(tile_max, s[c]);
  const float new_max = std::max(running_max, _mm512_reduce_max_ps(tile_max));
  if (new_max == -std::numeric_limits<float>::infinity()) {  // every key of this tile is masked for the row
    std::fill(probabilities, probabilities + kKeyTile / 2, 0u);
    return;
  }
  // 0 on the row's first keys (-inf); 1, with no e^x to compute, once the row's maximum has settled.
  const float correction = new_max == running_max ? 1.0f : exp_poly(running_max - new_max);
  __m512 sum = _mm512_mul_ps(_mm512_loadu_ps(running_sums), _mm512_set1_ps(correction));
  __m512 p[kScoreVectors];
  for (int c = 0; c < kScoreVectors; ++c) {
    p[c] = exp_of_nonpositive_16(_mm512_sub_ps(s[c], _mm512_set1_ps(new_max)));
    sum = _mm512_add_ps(sum, p[c]);
  }
  for (int c = 0; c < kScoreVectors; c += 2)  // 32 probabilities, in key order, as 16 bf16 pairs
    _mm512_storeu_si512(probabilities + 8 * c, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(p[c + 1], p[c])));
  _mm512_storeu_ps(running_sums, sum);
  running_max = new_max;
  if (correction != 1.0f) {
    const __m512 factor = _mm512_set1_ps(correction);
    for (int d = 0; d < D; d += 16) _mm512_storeu_ps(acc + d, _mm512_mul_ps(factor, _mm512_loadu_ps(acc + d)));
  }
}

struct Scratch {
  std::vector<uint32_t> probabilities;
  std::vector<float> scores, acc, running_max, running_sum;
  std::vector<const uint32_t*> q_rows;
  std::vector<int64_t> positions;
};

// The packed K and V tiles of one (sequence, kv head): tile t holds keys [64t, 64t + 64).
template <int D>
struct PackedTiles {
  static constexpr int64_t kKeyWords = (D / 2) * kKeyTile, kTileWords = 2 * kKeyWords;
  const uint32_t* base;
  const uint32_t* keys(int64_t tile) const { return base + tile * kTileWords; }
  const uint32_t* values(int64_t tile) const { return base + tile * kTileWords + kKeyWords; }
};

// Whether the AMX form computes head dim D: tile permission granted and D a multiple of 32.
template <int D>
bool tiles_take(bool amx) {
#ifdef RAPID_LLM_HAS_AMX
  return amx && D % 32 == 0 && amx_tiles::tile_state_granted();
#else
  return false;
#endif
}

// The item's M query rows . one packed key tile, into scores.
template <int D>
void tile_dots(const Scratch& s, int64_t M, const uint32_t* keys, float* scores) {
  constexpr int kScoreRows = 4;
  int64_t r = 0;
  for (; r + kScoreRows <= M; r += kScoreRows)
    score_rows<D, kScoreRows>(s.q_rows.data() + r, keys, scores + r * kKeyTile);
  for (; r < M; ++r) score_rows<D, 1>(s.q_rows.data() + r, keys, scores + r * kKeyTile);
}

// acc += the rows' probabilities . one packed value tile over its first `pairs` key pairs.
template <int D>
void tile_values(Scratch& s, int64_t M, const uint32_t* values, int64_t pairs) {
  constexpr int kValueRows = D >= 256 ? 1 : 256 / D;
  int64_t r = 0;
  for (; r + kValueRows <= M; r += kValueRows)
    accumulate_rows<D, kValueRows>(s.probabilities.data() + r * kKeyTile / 2, values, pairs, s.acc.data() + r * D);
  for (; r < M; ++r)
    accumulate_rows<D, 1>(s.probabilities.data() + r * kKeyTile / 2, values, pairs, s.acc.data() + r * D);
}

template <int D>
void attend_item(const PrefillItem& item, const Layout& L, const c10::BFloat16* query, PackedTiles<D> tiles,
                 int64_t seq_len, int64_t query_end, float scale, int64_t window, c10::BFloat16* out, Scratch& s) {
  const int64_t G = L.group, M = (item.token_end - item.token_begin) * G;
  s.probabilities.assign(M * kKeyTile / 2, 0u);
  s.scores.resize(M * kKeyTile);
  s.acc.assign(M * D, 0.0f);
  s.running_max.assign(M, -std::numeric_limits<float>::infinity());
  s.running_sum.assign(M * 16, 0.0f);
  s.q_rows.resize(M);
  s.positions.resize(M);
  for (int64_t r = 0; r < M; ++r) {
    const int64_t token = item.token_begin + r / G;
    s.q_rows[r] = reinterpret_cast<const uint32_t*>(query + token * L.q_token_stride +
                                                    (item.kv_head * G + r % G) * L.q_head_stride);
    s.positions[r] = seq_len - (query_end - token);
  }
  const int64_t first_position = s.positions[0], last_position = s.positions[M - 1];
  const int64_t key_end = last_position + 1;
  const int64_t key_begin = window > 0 ? std::max<int64_t>(0, first_position - window + 1) : 0;
  for (int64_t tile = key_begin / kKeyTile; tile * kKeyTile < key_end; ++tile) {
    const int64_t first = tile * kKeyTile, count = std::min(kKeyTile, key_end - first);
    // A tile needs masking when a key in it is after the first row's position or before the last row's window.
    const bool masked = count < kKeyTile || first + count - 1 > first_position ||
                        (window > 0 && first < last_position - window + 1);
    tile_dots<D>(s, M, tiles.keys(tile), s.scores.data());
    for (int64_t r = 0; r < M; ++r)
      softmax_row<D>(s.scores.data() + r * kKeyTile, scale, first, count, s.positions[r], window, masked,
                     s.running_max[r], s.running_sum.data() + r * 16, s.acc.data() + r * D,
                     s.probabilities.data() + r * kKeyTile / 2);
    tile_values<D>(s, M, tiles.values(tile), (count + 1) / 2);
  }
  for (int64_t r = 0; r < M; ++r) {
    const int64_t token = item.token_begin + r / G;
    c10::BFloat16* dst = out + (token * L.num_heads + item.kv_head * G + r % G) * D;
    const float sum = _mm512_reduce_add_ps(_mm512_loadu_ps(s.running_sum.data() + r * 16));
    const __m512 inverse = _mm512_set1_ps(1.0f / sum);
    for (int d = 0; d < D; d += 16) {  // every head dim the kernel takes is a multiple of 16
      const __m512 value = _mm512_mul_ps(_mm512_loadu_ps(s.acc.data() + r * D + d), inverse);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + d), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(value)));
    }
  }
}

template <typename C, int D>
void run(at::Tensor& output, const at::Tensor& query, const at::Tensor& kv_cache,
         const int64_t* query_start, const int64_t* seq_lens, const at::Tensor& block_tables,
         const at::Tensor& seq_ids, float scale, int64_t window, float k_scale, float v_scale, bool amx_tiles) {
  const Layout L = paged_kernels::layout_of(query, kv_cache);
  const bool amx = tiles_take<D>(amx_tiles);
  const int64_t num_kv_heads = L.num_kv_heads, num_seqs = seq_ids.size(0);
  const int64_t tokens_per_item = std::max<int64_t>(1, (amx ? kRowsPerAmxItem : kRowsPerItem) / L.group);
  const int64_t* ids = seq_ids.data_ptr<int64_t>();
  // Packed tiles: sequence i's start among all (sequence, kv head, tile) slots, and each slot's origin.
  std::vector<int64_t> first_slot(num_seqs + 1, 0);
  for (int64_t i = 0; i < num_seqs; ++i)
    first_slot[i + 1] = first_slot[i] + num_kv_heads * ((seq_lens[ids[i]] + kKeyTile - 1) / kKeyTile);
  std::vector<uint32_t> packed(first_slot[num_seqs] * PackedTiles<D>::kTileWords);
  std::vector<PrefillItem> items;
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int64_t seq = ids[i], begin = query_start[seq], end = query_start[seq + 1];
    for (int64_t token = begin; token < end; token += tokens_per_item) {
      const int64_t last = std::min(end, token + tokens_per_item);
      const int64_t keys = seq_lens[seq] - (end - last) + 1;
      for (int64_t head = 0; head < num_kv_heads; ++head) items.push_back({i, head, token, last, keys});
    }
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const PrefillItem& a, const PrefillItem& b) { return a.num_keys > b.num_keys; });
  const c10::BFloat16* q = query.data_ptr<c10::BFloat16>();
  const C* cache = static_cast<const C*>(kv_cache.const_data_ptr());
  c10::BFloat16* out = output.data_ptr<c10::BFloat16>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t table_stride = block_tables.stride(0);
  const int64_t num_items = static_cast<int64_t>(items.size()), num_slots = first_slot[num_seqs];
  const auto tiles_of = [&](int64_t i, int64_t head) {
    const int64_t tiles_per_head = (first_slot[i + 1] - first_slot[i]) / num_kv_heads;
    return PackedTiles<D>{packed.data() + (first_slot[i] + head * tiles_per_head) * PackedTiles<D>::kTileWords};
  };
#pragma omp parallel num_threads(at::get_num_threads())
  {
#pragma omp for schedule(static)
    for (int64_t slot = 0; slot < num_slots; ++slot) {
      const int64_t i = std::upper_bound(first_slot.begin(), first_slot.end(), slot) - first_slot.begin() - 1;
      const int64_t seq = ids[i], tiles_per_head = (first_slot[i + 1] - first_slot[i]) / num_kv_heads;
      const int64_t head = (slot - first_slot[i]) / tiles_per_head, tile = (slot - first_slot[i]) % tiles_per_head;
      const int64_t first = tile * kKeyTile, count = std::min(kKeyTile, seq_lens[seq] - first);
      const C* keys = cache + head * L.cache_head_stride;
      const int64_t* table = tables + seq * table_stride;
      uint32_t* dst = packed.data() + slot * PackedTiles<D>::kTileWords;
#ifdef RAPID_LLM_HAS_AMX
      if constexpr (D % 32 == 0) {
        if (amx) {
          uint16_t* halves = reinterpret_cast<uint16_t*>(dst);
          prefill_amx::pack_key_rows<C, D>(keys, table, L, first, count, k_scale, halves);
          prefill_amx::pack_value_columns<C, D>(keys + L.cache_kv_stride, table, L, first, count, v_scale,
                                                halves + kKeyTile * D);
          continue;
        }
      }
#endif
      pack_keys<C, D>(keys, table, L, first, count, k_scale, dst);
      pack_values<C, D>(keys + L.cache_kv_stride, table, L, first, count, v_scale, dst + PackedTiles<D>::kKeyWords);
    }
#ifdef RAPID_LLM_HAS_AMX
    if constexpr (D % 32 == 0) {
      if (amx) {
        prefill_amx::Scratch scratch;
        prefill_amx::configure_tiles();
#pragma omp for schedule(dynamic, 1)
        for (int64_t n = 0; n < num_items; ++n) {
          const PrefillItem& item = items[n];
          prefill_amx::attend_item<D>(item, L, q, reinterpret_cast<const uint16_t*>(tiles_of(item.seq, item.kv_head).base),
                                      seq_lens[ids[item.seq]], query_start[ids[item.seq] + 1], scale, window, out,
                                      scratch);
        }
        _tile_release();
      }
    }
#endif
    if (!amx) {
      Scratch scratch;
#pragma omp for schedule(dynamic, 1)
      for (int64_t n = 0; n < num_items; ++n) {
        const PrefillItem& item = items[n];
        attend_item<D>(item, L, q, tiles_of(item.seq, item.kv_head), seq_lens[ids[item.seq]],
                       query_start[ids[item.seq] + 1], scale, window, out, scratch);
      }
    }
  }
}

template <typename C>
using RunFn = void (*)(at::Tensor&, const at::Tensor&, const at::Tensor&, const int64_t*, const int64_t*,
                       const at::Tensor&, const at::Tensor&, float, int64_t, float, float, bool);

template <typename C>
RunFn<C> run_for(int64_t head_dim) {
  switch (head_dim) {
    case 32: return run<C, 32>;
    case 64: return run<C, 64>;
    case 80: return run<C, 80>;
    case 96: return run<C, 96>;
    case 128: return run<C, 128>;
    case 256: return run<C, 256>;
    default: TORCH_CHECK(false, "prefill_attention: head_dim ", head_dim, " is not one of 32, 64, 80, 96, 128, 256");
  }
}

}  // namespace

#endif

std::vector<int64_t> prefill_attention_head_dims() {
#ifdef RAPID_LLM_HAS_AVX512_BF16_ATTENTION
  return {32, 64, 80, 96, 128, 256};
#else
  return {};
#endif
}

// Same arguments as paged_attention (paged_attention.cpp); the query and output are bf16, the cache bf16 or
// float8_e4m3fn, and head_dim one of prefill_attention_head_dims() (none where the CPU lacks AVX-512 BF16).
// amx_tiles asks for the AMX form (prefill_attention_amx.h), taken where AMX is built and granted and head_dim is a
// multiple of 32 (else the AVX-512 BF16 form computes them).
void prefill_attention(at::Tensor output, const at::Tensor& query, const at::Tensor& kv_cache,
                       const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
                       const at::Tensor& block_tables, const at::Tensor& seq_ids, double scale,
                       int64_t sliding_window, double k_scale, double v_scale, bool amx_tiles) {
#ifdef RAPID_LLM_HAS_AVX512_BF16_ATTENTION
  paged_kernels::check_paged_arguments("prefill_attention", output, query, kv_cache, query_start_loc, seq_lens,
                                       block_tables, seq_ids, k_scale, v_scale);
  const bool fp8_cache = kv_cache.scalar_type() == at::kFloat8_e4m3fn;
  TORCH_CHECK(query.scalar_type() == at::kBFloat16 && output.scalar_type() == at::kBFloat16 &&
                  (fp8_cache || kv_cache.scalar_type() == at::kBFloat16),
              "prefill_attention: bf16 query and output, and a bf16 or float8_e4m3fn cache expected");
  TORCH_CHECK(query.stride(1) % 2 == 0 && query.stride(0) % 2 == 0,
              "prefill_attention: query rows must start at even offsets (read as bf16 pairs)");
  const int64_t* query_start = query_start_loc.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  if (fp8_cache)
    run_for<c10::Float8_e4m3fn>(query.size(2))(output, query, kv_cache, query_start, lens, block_tables, seq_ids,
                                               static_cast<float>(scale), sliding_window, static_cast<float>(k_scale),
                                               static_cast<float>(v_scale), amx_tiles);
  else
    run_for<c10::BFloat16>(query.size(2))(output, query, kv_cache, query_start, lens, block_tables, seq_ids,
                                          static_cast<float>(scale), sliding_window, 1.0f, 1.0f, amx_tiles);
#else
  TORCH_CHECK(false, "prefill_attention: this CPU lacks AVX-512 BF16 (the kernel needs avx512f and avx512_bf16)");
#endif
}
