// The step's new K/V rows copied into their cache slots, for the `cpu_cpp` kv_cache_store op: one pass
// over the tokens where the torch reference chains views, two dtype casts and two index_copy_ calls
// (~15 µs of dispatch per layer at decode sizes). Cache layout [2, blocks, block_size, kv heads, head
// dim], contiguous, so slot s of plane p is row p * blocks * block_size + s.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <cstring>

void kv_cache_store(const at::Tensor& key, const at::Tensor& value, at::Tensor& kv_cache,
                    const at::Tensor& slot_mapping) {
  TORCH_CHECK(kv_cache.is_contiguous() && kv_cache.dim() == 5 && kv_cache.size(0) == 2 && kv_cache.device().is_cpu() &&
                  key.device().is_cpu() && value.device().is_cpu() && slot_mapping.device().is_cpu(),
              "kv_cache_store: the cache must be a contiguous CPU [2, blocks, block_size, heads, dim] tensor");
  TORCH_CHECK(key.scalar_type() == kv_cache.scalar_type() && value.scalar_type() == kv_cache.scalar_type(),
              "kv_cache_store: key and value must have the cache's dtype");
  TORCH_CHECK(key.dim() == 3 && value.dim() == 3 && key.stride(2) == 1 && value.stride(2) == 1 &&
                  key.stride(1) == key.size(2) && value.stride(1) == value.size(2),
              "kv_cache_store: key/value must be [tokens, heads, dim] with contiguous rows");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous() && slot_mapping.dim() == 1,
              "kv_cache_store: slot_mapping must be a contiguous int64 vector");
  const int64_t tokens = key.size(0), row_elements = kv_cache.size(3) * kv_cache.size(4);
  TORCH_CHECK(key.size(1) * key.size(2) == row_elements && value.size(1) * value.size(2) == row_elements &&
                  slot_mapping.size(0) == tokens && value.size(0) == tokens,
              "kv_cache_store: key/value/slot_mapping shapes do not match the cache");
  const int64_t num_slots = kv_cache.size(1) * kv_cache.size(2);
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const int64_t row_bytes = row_elements * kv_cache.element_size();
  auto* cache = static_cast<char*>(kv_cache.data_ptr());
  const auto* keys = static_cast<const char*>(key.data_ptr());
  const auto* values = static_cast<const char*>(value.data_ptr());
  const int64_t key_stride = key.stride(0) * key.element_size(), value_stride = value.stride(0) * value.element_size();
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(slots[t] >= 0 && slots[t] < num_slots, "kv_cache_store: slot ", slots[t], " is outside the cache");
  at::parallel_for(0, tokens, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      std::memcpy(cache + slots[t] * row_bytes, keys + t * key_stride, row_bytes);
      std::memcpy(cache + (num_slots + slots[t]) * row_bytes, values + t * value_stride, row_bytes);
    }
  });
}
