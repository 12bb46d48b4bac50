// e^x for fp32 in plain arithmetic the compiler vectorises (libm's expf is not without -ffast-math):
// e^x = 2^n * 2^f with |f| <= 1/2, 2^f from its degree-7 Taylor series (relative error about 1e-7).
// Like expf it gives 0 below -87.3 and +inf above 88.7; NaN stays NaN.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

inline float exp_poly(float x) {
  const float clamped = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float y = clamped * 1.4426950408889634f;
  const float n = std::nearbyint(y);
  const float f = y - n;
  float p = 1.525273380405984e-05f;
  p = p * f + 1.5403530393381606e-04f;
  p = p * f + 1.3333558146428443e-03f;
  p = p * f + 9.618129107628477e-03f;
  p = p * f + 5.550410866482158e-02f;
  p = p * f + 2.402265069591007e-01f;
  p = p * f + 6.931471805599453e-01f;
  p = p * f + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  // Selects, not branches, so loops calling this still vectorise.
  float value = p * scale;
  value = x < -87.33654f ? 0.0f : value;
  value = x > 88.72283f ? std::numeric_limits<float>::infinity() : value;
  return x != x ? x : value;
}
