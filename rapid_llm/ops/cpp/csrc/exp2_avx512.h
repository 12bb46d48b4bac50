// 2^y for 16 fp32 lanes on AVX-512 (with DQ): 2^floor(y) applied by scalef to 2^f, f = y - floor(y) in
// [0, 1) from a degree-5 polynomial fitted for relative error (below 2e-7). Overflows to +inf, underflows to 0
// (through subnormals); NaN for y = +inf. Shared by the AMX prefill softmax and the bf16 silu.
#pragma once

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#include <immintrin.h>

inline __m512 exp2_16(__m512 y) {
  const __m512 f = _mm512_reduce_ps(y, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(0.0018775686621665955f), f, _mm512_set1_ps(0.008989342488348484f));
  for (const float c : {0.055826336145401f, 0.24015359580516815f, 0.6931530833244324f, 0.9999999403953552f})
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
  return _mm512_scalef_ps(p, y);
}
#endif
