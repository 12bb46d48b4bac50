// The epilogue of the packed linears' gated form (amx_linear.cpp, avx512_linear.cpp): silu(gate) * up for 16
// outputs of one row from the fp32 sums of gate block b and up block b + N/32 of a merged [gate; up] weight. Each
// sum (with its bias) is rounded to bf16 as the plain linear stores it, then silu and the product are rounded as
// silu_and_mul's kernel rounds them (silu_bf16.h), so the gated form equals the linear followed by silu_and_mul
// bit for bit while the [rows, N] gate_up output is never written.
#pragma once

#include <c10/util/BFloat16.h>

#include "silu_bf16.h"

#ifdef RAPID_LLM_HAS_SILU_BF16

namespace gated_epilogue {

inline void store_16(__m512 gate_sums, __m512 up_sums, c10::BFloat16* out) {
  using bf16_avx512::round_16;
  const __m512 product = _mm512_mul_ps(round_16(silu_bf16::silu_16(round_16(gate_sums))), round_16(up_sums));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), bf16_avx512::narrow_16(product));
}

}  // namespace gated_epilogue

#endif
