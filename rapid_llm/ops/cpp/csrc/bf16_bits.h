// bf16 <-> fp32 by bit operations, which the compiler vectorises in `omp simd` loops (c10::BFloat16's
// conversions do not): shared by fused_elementwise.cpp and amx_moe.cpp.
#pragma once

#include <cstdint>
#include <cstring>

inline float bf16_bits_to_float(uint16_t bits) {
  const uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &widened, sizeof(value));
  return value;
}

// Round to nearest even, as c10::BFloat16 does; any NaN becomes the quiet NaN (rounding could carry
// a NaN's payload into the exponent).
inline uint16_t float_to_bf16_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(value != value ? 0x7FC0u : rounded);
}
