// apply_token_bitmask (CPU): -inf into every float32 logit whose bit in a grammar's int32 bitmask is clear.
// One pass over the words: an all-ones word (every token allowed) is skipped, an all-zeros word (the usual
// case inside a JSON value, where few tokens are allowed) is one fill; only mixed words go bit by bit
// (two AVX-512 masked stores where the CPU has them).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <limits>

void apply_token_bitmask(at::Tensor logits, const at::Tensor& bitmask) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.stride(1) == 1,
              "apply_token_bitmask: logits must be float32 [rows, vocab] with contiguous rows");
  TORCH_CHECK(bitmask.dim() == 2 && bitmask.scalar_type() == at::kInt && bitmask.is_contiguous(),
              "apply_token_bitmask: bitmask must be a contiguous int32 [rows, words]");
  TORCH_CHECK(bitmask.size(0) == logits.size(0) && bitmask.size(1) * 32 >= logits.size(1),
              "apply_token_bitmask: bitmask [", bitmask.size(0), ", ", bitmask.size(1), "] does not cover logits [",
              logits.size(0), ", ", logits.size(1), "]");
  const int64_t vocab = logits.size(1), words = (vocab + 31) / 32, row_stride = logits.stride(0);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float* out = logits.data_ptr<float>();
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(bitmask.data_ptr<int32_t>());
  at::parallel_for(0, logits.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      float* row_out = out + row * row_stride;
      const uint32_t* row_bits = bits + row * bitmask.size(1);
      for (int64_t word = 0; word < words; ++word) {
        const uint32_t value = row_bits[word];
        if (value == 0xFFFFFFFFu) continue;
        const int64_t first = word * 32, count = std::min<int64_t>(32, vocab - first);
        if (value == 0) {
          std::fill(row_out + first, row_out + first + count, neg_inf);
          continue;
        }
        float* lanes = row_out + first;
#ifdef __AVX512F__
        if (count == 32) {
          // Two masked stores of -inf into the forbidden lanes (the clear bits).
          const __m512 neg = _mm512_set1_ps(neg_inf);
          _mm512_mask_storeu_ps(lanes, static_cast<__mmask16>(~value & 0xFFFFu), neg);
          _mm512_mask_storeu_ps(lanes + 16, static_cast<__mmask16>(~value >> 16), neg);
          continue;
        }
#endif
        for (int64_t bit = 0; bit < count; ++bit) {
          if (!((value >> bit) & 1u)) lanes[bit] = neg_inf;
        }
      }
    }
  });
}
