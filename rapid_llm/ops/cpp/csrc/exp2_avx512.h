// 2^y for 16 fp32 lanes on AVX-512 (with DQ): 2^floor(y) applied by scalef to 2^f, f = y - floor(y) in
// [0, 1), from a polynomial fitted for relative error: DEGREE 5 stays below 2e-7 (the bf16 silu, which must
// round as torch's expf does), DEGREE 3 below 8e-5 (the AMX prefill softmax, whose probabilities are rounded
// to bf16 next: up to 4e-3). Overflows to +inf; NaN for y = +inf or NaN. Below y = -125 it gives 2^-125 times
// the polynomial's value at 0 (just under 1), never a subnormal: on Intel CPUs every instruction that meets a
// subnormal takes a microcode assist (~30x the cost of the whole 2^y here).
#pragma once

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#include <immintrin.h>

template <int DEGREE>
inline __m512 exp2_16(__m512 y) {
  static_assert(DEGREE == 3 || DEGREE == 5, "fitted for degrees 3 and 5");
  y = _mm512_max_ps(_mm512_set1_ps(-125.0f), y);  // max returns its second operand, y, when y is NaN
  const __m512 f = _mm512_reduce_ps(y, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p;
  if constexpr (DEGREE == 5) {
    p = _mm512_fmadd_ps(_mm512_set1_ps(0.0018775686621665955f), f, _mm512_set1_ps(0.008989342488348484f));
    for (const float c : {0.055826336145401f, 0.24015359580516815f, 0.6931530833244324f, 0.9999999403953552f})
      p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
  } else {
    p = _mm512_fmadd_ps(_mm512_set1_ps(0.07802354544401169f), f, _mm512_set1_ps(0.22606661915779114f));
    for (const float c : {0.695834755897522f, 0.9999249577522278f}) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
  }
  return _mm512_scalef_ps(p, y);
}
#endif
