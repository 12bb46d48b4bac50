// Causal attention over the paged KV cache on the CPU, for one mixed batch (prefills, chunks after
// cached context, decodes). K/V rows are read in place through each sequence's block table: nothing is
// gathered or padded. A work item is (query token, key range), whose kv heads one thread takes in turn; each
// head's group of query heads shares every K/V row it converts to fp32, and an online softmax (fp32, one
// rescale per cache block) keeps one pass over the keys. When there are too few items to keep every thread
// busy (one or two long decodes), each token's key range is split and the partial results are merged by
// log-sum-exp. Only the given sequences are computed: the Python backend sends long prefills to a GEMM-based
// kernel instead.
// The cache is either in the query's dtype or fp8 e4m3 (`--kv-cache-dtype fp8`): each row is then
// multiplied by its per-tensor dequantization scale (k_scale / v_scale) while it is widened to fp32.
// bf16 query and cache with head_dim a multiple of 32, on AVX-512 BF16 CPUs: paged_attention_bf16.h.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Float8_e4m3fn.h>

#include "paged_attention.h"
#include "paged_attention_bf16.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

using paged_kernels::Layout;
using paged_kernels::WorkItem;

constexpr int kMinSplitKeys = 256;   // shorter splits cost more in merging than they gain in parallelism
constexpr int kItemsPerThread = 4;   // enough items per thread for dynamic scheduling to balance

template <typename T>
inline void to_float(const T* src, float* dst, int n, float scale) {
#pragma omp simd
  for (int i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]) * scale;
}

inline float dot(const float* a, const float* b, int n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// One item's kv head: its `group` query heads of one token against keys [key_begin, key_end).
// Writes the unnormalised accumulator, running max and sum (acc [group, D], max/sum [group]).
// kHeadDim > 0 fixes head_dim at compile time (the row loops then unroll; 0 = any head_dim).
// C is the cache's element type (T, or fp8 with k_scale / v_scale; 1 for a T cache).
template <typename T, typename C, int kHeadDim>
void attend(const WorkItem& item, int64_t kv_head, const Layout& L, const T* query, const C* cache,
            const int64_t* block_table, float scale, float k_scale, float v_scale, float* acc, float* running_max,
            float* running_sum, std::vector<float>& scratch) {
  const int64_t D = kHeadDim > 0 ? kHeadDim : L.head_dim, G = L.group, BS = L.block_size;
  scratch.resize(G * D + 2 * D + G * BS);
  float* q = scratch.data();
  float* k_row = q + G * D;
  float* v_row = k_row + D;
  float* scores = v_row + D;  // [G, BS]
  for (int64_t g = 0; g < G; ++g) {
    const T* src = query + item.token * L.q_token_stride + (kv_head * G + g) * L.q_head_stride;
    to_float(src, q + g * D, D, scale);
    running_max[g] = -std::numeric_limits<float>::infinity();
    running_sum[g] = 0.0f;
  }
  std::fill(acc, acc + G * D, 0.0f);
  const C* keys = cache + kv_head * L.cache_head_stride;
  const C* values = keys + L.cache_kv_stride;
  for (int64_t start = item.key_begin; start < item.key_end;) {
    const int64_t block = block_table[start / BS];
    const int64_t offset = start % BS;
    const int64_t count = std::min(BS - offset, item.key_end - start);
    const int64_t row0 = block * L.cache_block_stride + offset * L.cache_slot_stride;
    for (int64_t j = 0; j < count; ++j) {
      to_float(keys + row0 + j * L.cache_slot_stride, k_row, D, k_scale);
      for (int64_t g = 0; g < G; ++g) scores[g * BS + j] = dot(q + g * D, k_row, D);
    }
    for (int64_t g = 0; g < G; ++g)
      paged_kernels::online_softmax_step(scores + g * BS, count, running_max[g], running_sum[g], acc + g * D, D);
    for (int64_t j = 0; j < count; ++j) {
      to_float(values + row0 + j * L.cache_slot_stride, v_row, D, v_scale);
      for (int64_t g = 0; g < G; ++g) {
        const float p = scores[g * BS + j];
        float* a = acc + g * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) a[d] += p * v_row[d];
      }
    }
    start += count;
  }
}

// Items for every (token, split) of the sequences `seq_ids`; `num_partials` counts the split items.
std::vector<WorkItem> plan_items(const int64_t* query_start, const int64_t* seq_lens, const int64_t* seq_ids,
                                 int64_t num_seqs, int64_t sliding_window,
                                 int64_t block_size, int num_threads, int64_t& num_partials) {
  int64_t num_tokens = 0;
  for (int64_t i = 0; i < num_seqs; ++i) num_tokens += query_start[seq_ids[i] + 1] - query_start[seq_ids[i]];
  if (num_tokens == 0) return {};
  const int64_t wanted_items = static_cast<int64_t>(num_threads) * kItemsPerThread;
  const int64_t splits_wanted = num_tokens >= wanted_items ? 1 : (wanted_items + num_tokens - 1) / num_tokens;
  std::vector<WorkItem> items;
  items.reserve(num_tokens * (splits_wanted > 1 ? 2 : 1));
  num_partials = 0;
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int64_t seq = seq_ids[i];
    const int64_t end = query_start[seq + 1];
    for (int64_t token = query_start[seq]; token < end; ++token) {
      const int64_t position = seq_lens[seq] - (end - token);
      const int64_t key_end = position + 1;
      const int64_t key_begin = sliding_window > 0 ? std::max<int64_t>(0, key_end - sliding_window) : 0;
      const int64_t num_keys = key_end - key_begin;
      int64_t split = std::max<int64_t>(kMinSplitKeys, (num_keys + splits_wanted - 1) / splits_wanted);
      split = (split + block_size - 1) / block_size * block_size;  // whole blocks per split
      if (splits_wanted == 1 || split >= num_keys) {
        items.push_back({token, seq, key_begin, key_end, -1});
        continue;
      }
      for (int64_t begin = key_begin; begin < key_end; begin += split)
        items.push_back({token, seq, begin, std::min(key_end, begin + split), num_partials++});
    }
  }
  return items;
}

template <typename T, typename C>
using AttendFn = void (*)(const WorkItem&, int64_t, const Layout&, const T*, const C*, const int64_t*, float, float,
                          float, float*, float*, float*, std::vector<float>&);

// An item's every kv head in one call, chunk by chunk (paged_attention_bf16.h); null where none applies.
template <typename T, typename C>
using AttendAllFn = void (*)(const WorkItem&, const Layout&, const T*, const C*, const int64_t*, float, float*,
                             float*, float*);

template <typename T, typename C>
AttendAllFn<T, C> attend_all_heads_for(int64_t head_dim) {
#ifdef RAPID_LLM_HAS_AVX512_BF16_ATTENTION
  if constexpr (std::is_same_v<T, c10::BFloat16> && std::is_same_v<C, c10::BFloat16>) {
    switch (head_dim) {
      case 32: return paged_kernels::attend_bf16<32>;
      case 64: return paged_kernels::attend_bf16<64>;
      case 128: return paged_kernels::attend_bf16<128>;
      case 256: return paged_kernels::attend_bf16<256>;
      default: break;
    }
  }
#endif
  return nullptr;
}

template <typename T, typename C>
AttendFn<T, C> attend_for(int64_t head_dim) {
  switch (head_dim) {
    case 32: return attend<T, C, 32>;
    case 64: return attend<T, C, 64>;
    case 128: return attend<T, C, 128>;
    case 256: return attend<T, C, 256>;
    default: return attend<T, C, 0>;
  }
}

template <typename T, typename C>
void run(at::Tensor& output, const at::Tensor& query, const at::Tensor& kv_cache,
         const at::Tensor& query_start_loc, const at::Tensor& seq_lens, const at::Tensor& block_tables,
         const at::Tensor& seq_ids, double scale, int64_t sliding_window, float k_scale, float v_scale) {
  const Layout L = paged_kernels::layout_of(query, kv_cache);
  const int64_t D = L.head_dim, G = L.group;
  const int num_threads = at::get_num_threads();
  int64_t num_partials = 0;
  const std::vector<WorkItem> items =
      plan_items(query_start_loc.data_ptr<int64_t>(), seq_lens.data_ptr<int64_t>(), seq_ids.data_ptr<int64_t>(),
                 seq_ids.size(0), sliding_window, L.block_size, num_threads, num_partials);
  // Partial rows [num_partials, kv_heads, G, D] and their max/sum; direct items use a per-thread row.
  std::vector<float> partial_acc(num_partials * L.num_kv_heads * G * D);
  std::vector<float> partial_max(num_partials * L.num_kv_heads * G), partial_sum(partial_max.size());
  const T* q = query.data_ptr<T>();
  const C* cache = static_cast<const C*>(kv_cache.const_data_ptr());
  T* out = output.data_ptr<T>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t table_stride = block_tables.stride(0);
  const int64_t num_items = static_cast<int64_t>(items.size());
  const AttendFn<T, C> attend_item = attend_for<T, C>(D);
  const AttendAllFn<T, C> attend_all_heads = attend_all_heads_for<T, C>(D);

#pragma omp parallel num_threads(num_threads)
  {
    const int64_t heads = L.num_kv_heads * G;  // the item's query heads, kv head by kv head
    std::vector<float> scratch, direct_acc(heads * D), direct_max(heads), direct_sum(heads);
#pragma omp for schedule(dynamic, 1)
    for (int64_t n = 0; n < num_items; ++n) {
      const WorkItem& item = items[n];
      const bool direct = item.partial < 0;
      // Every kv head of the item in this thread: a slot's rows of all heads lie side by side in the cache,
      // so the lines the hardware brings for one head serve the next instead of another core's fetching
      // them again (a head per work unit read an 8000-token decode's K/V from memory twice over). The bf16
      // kernel takes them all in one call, key chunk by key chunk; the generic one head by head.
      float* acc = direct ? direct_acc.data() : partial_acc.data() + item.partial * heads * D;
      float* running_max = direct ? direct_max.data() : partial_max.data() + item.partial * heads;
      float* running_sum = direct ? direct_sum.data() : partial_sum.data() + item.partial * heads;
      const int64_t* table = tables + item.seq * table_stride;
      if (attend_all_heads != nullptr) {
        attend_all_heads(item, L, q, cache, table, static_cast<float>(scale), acc, running_max, running_sum);
      } else {
        for (int64_t kv_head = 0; kv_head < L.num_kv_heads; ++kv_head)
          attend_item(item, kv_head, L, q, cache, table, static_cast<float>(scale), k_scale, v_scale,
                      acc + kv_head * G * D, running_max + kv_head * G, running_sum + kv_head * G, scratch);
      }
      if (!direct) continue;
      for (int64_t head = 0; head < heads; ++head) {
        T* dst = out + (item.token * L.num_heads + head) * D;
        const float inverse = 1.0f / running_sum[head];
        for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<T>(acc[head * D + d] * inverse);
      }
    }
  }
  if (num_partials == 0) return;
  // Merge each split token: consecutive items of one token, weighted by e^(max_i - max).
  std::vector<int64_t> first_items;
  for (size_t i = 0; i < items.size(); ++i)
    if (items[i].partial >= 0 && (i == 0 || items[i - 1].token != items[i].token))
      first_items.push_back(static_cast<int64_t>(i));
  const int64_t num_merges = static_cast<int64_t>(first_items.size()) * L.num_kv_heads;
#pragma omp parallel for num_threads(num_threads) schedule(static)
  for (int64_t merge = 0; merge < num_merges; ++merge) {
    const int64_t first = first_items[merge / L.num_kv_heads];
    const int64_t kv_head = merge % L.num_kv_heads;
    const int64_t token = items[first].token;
    int64_t last = first;
    while (last + 1 < static_cast<int64_t>(items.size()) && items[last + 1].token == token) ++last;
    std::vector<float> merged(D);
    for (int64_t g = 0; g < G; ++g) {
      float global_max = -std::numeric_limits<float>::infinity();
      for (int64_t i = first; i <= last; ++i)
        global_max = std::max(global_max, partial_max[(items[i].partial * L.num_kv_heads + kv_head) * G + g]);
      std::fill(merged.begin(), merged.end(), 0.0f);
      float total = 0.0f;
      for (int64_t i = first; i <= last; ++i) {
        const int64_t row = items[i].partial * L.num_kv_heads + kv_head;
        const float weight = std::exp(partial_max[row * G + g] - global_max);
        total += weight * partial_sum[row * G + g];
        const float* acc = partial_acc.data() + (row * G + g) * D;
        for (int64_t d = 0; d < D; ++d) merged[d] += weight * acc[d];
      }
      T* dst = out + (token * L.num_heads + kv_head * G + g) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<T>(merged[d] / total);
    }
  }
}

}  // namespace

bool paged_attention_bf16_kernel() {
#ifdef RAPID_LLM_HAS_AVX512_BF16_ATTENTION
  return true;
#else
  return false;
#endif
}

// output [T, Hq, D] (contiguous), query [T, Hq, D] (last dim contiguous), kv_cache [2, blocks, block_size,
// Hkv, D]; query_start_loc [S + 1], seq_lens [S], block_tables [S, W] int64; only the rows of the
// sequences seq_ids [S'] (int64) are computed; sliding_window 0 = none. kv_cache in the query's dtype
// (k_scale = v_scale = 1) or float8_e4m3fn, read as cache * k_scale (keys) and cache * v_scale (values).
void paged_attention(at::Tensor output, const at::Tensor& query, const at::Tensor& kv_cache,
                     const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
                     const at::Tensor& block_tables, const at::Tensor& seq_ids, double scale,
                     int64_t sliding_window, double k_scale, double v_scale) {
  paged_kernels::check_paged_arguments("paged_attention", output, query, kv_cache, query_start_loc, seq_lens,
                                       block_tables, seq_ids, k_scale, v_scale);
  const bool fp8_cache = kv_cache.scalar_type() == at::kFloat8_e4m3fn;
  TORCH_CHECK((fp8_cache || query.scalar_type() == kv_cache.scalar_type()) &&
                  output.scalar_type() == query.scalar_type(),
              "paged_attention: query and output must share one dtype, and kv_cache it or float8_e4m3fn");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "paged_attention", [&] {
    if (fp8_cache)
      run<scalar_t, c10::Float8_e4m3fn>(output, query, kv_cache, query_start_loc, seq_lens, block_tables, seq_ids,
                                        scale, sliding_window, static_cast<float>(k_scale),
                                        static_cast<float>(v_scale));
    else
      run<scalar_t, scalar_t>(output, query, kv_cache, query_start_loc, seq_lens, block_tables, seq_ids, scale,
                              sliding_window, 1.0f, 1.0f);
  });
}
