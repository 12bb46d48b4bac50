// Fused CPU versions of the small per-layer ops: rms_norm, fused add + rms_norm, silu_and_mul and rotary
// (neox or gpt-j pairs, partial). Each is one pass over its rows instead of the 3-9 ATen ops the torch
// reference chains, which at decode sizes is mostly per-op dispatch cost. A row is widened to fp32 into a
// scratch buffer, computed there and narrowed back, with plain loops the compiler vectorises (bf16 <-> fp32
// by bit operations, e^x by a polynomial). Every intermediate is rounded to the tensor dtype exactly where
// the reference rounds (each ATen op rounds its result), so outputs equal torch_ref's up to the order of
// the fp32 sum of squares and e^x's last bit. fp-contract is off in this file (GCC pragma below; the
// extension is built with the C++ compiler torch's cpp_extension picks, g++ on Linux). Rows run in parallel (at::parallel_for).
// On AVX-512 BF16 CPUs, bf16 rms_norm, fused_add_rms_norm, silu_and_mul and neox rotary rows take explicit
// 16-lane kernels instead (rms_norm_bf16.h, silu_bf16.h, rotary_bf16.h), rounding at the same points.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "bf16_bits.h"
#include "exp_poly.h"
#include "rms_norm_bf16.h"
#include "rotary_bf16.h"
#include "silu_bf16.h"

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

// No fused multiply-adds here: a*b - c*d must round each product as the reference's separate ATen ops do
// (in fp32 too, where rounding is the identity), or rotary outputs drift by an ulp from torch_ref's.
#pragma GCC optimize("fp-contract=off")

namespace {

constexpr int64_t kRowsPerTask = 16;

// Widen n values of T to fp32, narrow fp32 to T, and round fp32 to T's precision in place.
template <typename T>
void widen(const T* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}
template <>
void widen<c10::BFloat16>(const c10::BFloat16* src, float* dst, int64_t n) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_float(bits[i]);
}

template <typename T>
void narrow(const float* src, T* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(src[i]);
}
template <>
void narrow<c10::BFloat16>(const float* src, c10::BFloat16* dst, int64_t n) {
  uint16_t* bits = reinterpret_cast<uint16_t*>(dst);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) bits[i] = float_to_bf16_bits(src[i]);
}

// x rounded to T's precision (the identity for fp32): where each ATen op of the reference rounds its result.
template <typename T>
inline float round_as(float x) {
  return static_cast<float>(static_cast<T>(x));
}
template <>
inline float round_as<float>(float x) {
  return x;
}
template <>
inline float round_as<c10::BFloat16>(float x) {
  return bf16_bits_to_float(float_to_bf16_bits(x));
}

template <typename T>
void round_to(float* values, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) values[i] = round_as<T>(values[i]);
}

// Loops the dispatch lambdas below need (a pragma cannot sit inside a macro's argument).
inline void add_into(float* values, const float* other, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) values[i] += other[i];
}

inline void multiply_into(float* values, const float* other, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) values[i] *= other[i];
}

inline void silu_into(float* values, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) values[i] = values[i] / (1.0f + exp_poly(-values[i]));
}

// weight * round(x / rms(x)), x already widened (and rounded) in `row`; writes `out`.
template <typename T>
void normalize_row(float* row, const float* weight, T* out, int64_t hidden, float eps) {
  float sum_squares = 0.0f;
#pragma omp simd reduction(+ : sum_squares)
  for (int64_t i = 0; i < hidden; ++i) sum_squares += row[i] * row[i];
  const float inverse_rms = 1.0f / std::sqrt(sum_squares / static_cast<float>(hidden) + eps);
#pragma omp simd
  for (int64_t i = 0; i < hidden; ++i) row[i] *= inverse_rms;
  round_to<T>(row, hidden);
  multiply_into(row, weight, hidden);
  narrow(row, out, hidden);
}

void check_rows(const at::Tensor& x, const char* what) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.stride(1) == 1, what, ": CPU [rows, width] tensor with ",
              "contiguous rows expected");
}

void check_weight(const at::Tensor& weight, const at::Tensor& x) {
  TORCH_CHECK(weight.dim() == 1 && weight.is_contiguous() && weight.size(0) == x.size(1) &&
                  weight.scalar_type() == x.scalar_type(),
              "rms_norm: weight must be a contiguous [width] tensor in the input's dtype");
}

// A bf16 tensor's values as their bits, for the explicit AVX-512 row kernels.
template <typename T>
const uint16_t* bits_of(const T* values) {
  return reinterpret_cast<const uint16_t*>(values);
}
template <typename T>
uint16_t* mutable_bits_of(T* values) {
  return reinterpret_cast<uint16_t*>(values);
}

template <typename T>
std::vector<float> widened_weight(const at::Tensor& weight) {
  std::vector<float> values(weight.size(0));
  widen(weight.data_ptr<T>(), values.data(), weight.size(0));
  return values;
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, "rms_norm");
  check_weight(weight, x);
  auto out = at::empty(x.sizes(), x.options());
  const int64_t rows = x.size(0), hidden = x.size(1), stride = x.stride(0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    const scalar_t* src = x.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
#ifdef RAPID_LLM_HAS_RMS_NORM_BF16
    if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
      at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r)
          rms_norm_bf16::normalize_row(bits_of(src + r * stride), bits_of(weight.data_ptr<scalar_t>()),
                                       mutable_bits_of(dst + r * hidden), hidden, static_cast<float>(eps));
      });
      return;
    }
#endif
    const std::vector<float> w = widened_weight<scalar_t>(weight);
    at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
      std::vector<float> row(hidden);
      for (int64_t r = begin; r < end; ++r) {
        widen(src + r * stride, row.data(), hidden);
        normalize_row(row.data(), w.data(), dst + r * hidden, hidden, static_cast<float>(eps));
      }
    });
  });
  return out;
}

std::vector<at::Tensor> fused_add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                           const at::Tensor& weight, double eps) {
  check_rows(x, "fused_add_rms_norm");
  check_rows(residual, "fused_add_rms_norm residual");
  check_weight(weight, x);
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type(),
              "fused_add_rms_norm: residual must match x");
  auto out = at::empty(x.sizes(), x.options());
  auto summed = at::empty(x.sizes(), x.options());
  const int64_t rows = x.size(0), hidden = x.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fused_add_rms_norm", [&] {
    const scalar_t* a = x.data_ptr<scalar_t>();
    const scalar_t* b = residual.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    scalar_t* sum = summed.data_ptr<scalar_t>();
#ifdef RAPID_LLM_HAS_RMS_NORM_BF16
    if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
      at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r)
          rms_norm_bf16::add_normalize_row(bits_of(a + r * x.stride(0)), bits_of(b + r * residual.stride(0)),
                                           bits_of(weight.data_ptr<scalar_t>()), mutable_bits_of(sum + r * hidden),
                                           mutable_bits_of(dst + r * hidden), hidden, static_cast<float>(eps));
      });
      return;
    }
#endif
    const std::vector<float> w = widened_weight<scalar_t>(weight);
    at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
      std::vector<float> row(hidden), other(hidden);
      for (int64_t r = begin; r < end; ++r) {
        widen(a + r * x.stride(0), row.data(), hidden);
        widen(b + r * residual.stride(0), other.data(), hidden);
        add_into(row.data(), other.data(), hidden);
        round_to<scalar_t>(row.data(), hidden);
        narrow(row.data(), sum + r * hidden, hidden);
        normalize_row(row.data(), w.data(), dst + r * hidden, hidden, static_cast<float>(eps));
      }
    });
  });
  return {out, summed};
}

at::Tensor silu_and_mul(const at::Tensor& x) {
  check_rows(x, "silu_and_mul");
  TORCH_CHECK(x.size(1) % 2 == 0, "silu_and_mul: the width must be even ([gate | up])");
  const int64_t rows = x.size(0), width = x.size(1) / 2;
  auto out = at::empty({rows, width}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "silu_and_mul", [&] {
    const scalar_t* src = x.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
#ifdef RAPID_LLM_HAS_SILU_BF16
    if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
      at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r)
          silu_bf16::silu_and_mul_row(bits_of(src + r * x.stride(0)), bits_of(src + r * x.stride(0) + width),
                                      mutable_bits_of(dst + r * width), width);
      });
      return;
    }
#endif
    at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
      std::vector<float> gate(width), up(width);
      for (int64_t r = begin; r < end; ++r) {
        widen(src + r * x.stride(0), gate.data(), width);
        widen(src + r * x.stride(0) + width, up.data(), width);
        silu_into(gate.data(), width);
        round_to<scalar_t>(gate.data(), width);
        multiply_into(gate.data(), up.data(), width);
        narrow(gate.data(), dst + r * width, width);
      }
    });
  });
  return out;
}

namespace {

// Rotates one [rows, heads * head_dim] tensor into `out` (contiguous, same shape). Each pair is
// (x1 cos - x2 sin, x2 cos + x1 sin), every product and the sum rounded as the reference rounds them; the
// pairs are (i, i + half) in neox style and (2i, 2i + 1) in gpt-j style, a compile-time choice so the
// neox loop reads and writes contiguous halves.
template <typename T, bool kNeox>
void rotate(const at::Tensor& x, at::Tensor& out, const T* cos, const T* sin, int64_t table_stride,
            int64_t head_dim, int64_t rotary_dim) {
  const int64_t rows = x.size(0), width = x.size(1), heads = width / head_dim, half = rotary_dim / 2;
  const T* src = x.data_ptr<T>();
  T* dst = out.data_ptr<T>();
#ifdef RAPID_LLM_HAS_ROTARY_BF16
  if constexpr (kNeox && std::is_same_v<T, c10::BFloat16>) {
    at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        rotary_bf16::rotate_neox_row(bits_of(src + r * x.stride(0)), bits_of(cos + r * table_stride),
                                     bits_of(sin + r * table_stride), mutable_bits_of(dst + r * width), heads,
                                     head_dim, rotary_dim);
    });
    return;
  }
#endif
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
    std::vector<float> row(width), c(half), s(half);
    for (int64_t r = begin; r < end; ++r) {
      widen(src + r * x.stride(0), row.data(), width);
      widen(cos + r * table_stride, c.data(), half);
      widen(sin + r * table_stride, s.data(), half);
      for (int64_t head = 0; head < heads; ++head) {
        float* h = row.data() + head * head_dim;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const int64_t first = kNeox ? i : 2 * i, second = kNeox ? i + half : 2 * i + 1;
          const float x1 = h[first], x2 = h[second];
          h[first] = round_as<T>(x1 * c[i]) - round_as<T>(x2 * s[i]);
          h[second] = round_as<T>(x2 * c[i]) + round_as<T>(x1 * s[i]);
        }
      }
      narrow(row.data(), dst + r * width, width);
    }
  });
}

}  // namespace

std::vector<at::Tensor> rotary_embedding(const at::Tensor& query, const at::Tensor& key,
                                         const at::Tensor& cos, const at::Tensor& sin, int64_t head_dim,
                                         int64_t rotary_dim, bool is_neox_style) {
  check_rows(query, "rotary_embedding query");
  check_rows(key, "rotary_embedding key");
  TORCH_CHECK(key.size(0) == query.size(0) && key.scalar_type() == query.scalar_type() &&
                  query.size(1) % head_dim == 0 && key.size(1) % head_dim == 0 && rotary_dim <= head_dim &&
                  rotary_dim % 2 == 0,
              "rotary_embedding: query/key rows must hold whole heads of head_dim >= rotary_dim (even)");
  TORCH_CHECK(cos.dim() == 3 && cos.stride(2) == 1 && sin.sizes() == cos.sizes() &&
                  sin.strides() == cos.strides() && cos.size(0) == query.size(0) &&
                  cos.size(2) == rotary_dim / 2 && cos.scalar_type() == query.scalar_type(),
              "rotary_embedding: cos/sin [rows, 1, rotary_dim / 2] in the query's dtype expected");
  auto rotated_query = at::empty(query.sizes(), query.options());
  auto rotated_key = at::empty(key.sizes(), key.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "rotary_embedding", [&] {
    const scalar_t* c = cos.data_ptr<scalar_t>();
    const scalar_t* s = sin.data_ptr<scalar_t>();
    const auto rotate_style = is_neox_style ? rotate<scalar_t, true> : rotate<scalar_t, false>;
    rotate_style(query, rotated_query, c, s, cos.stride(0), head_dim, rotary_dim);
    rotate_style(key, rotated_key, c, s, cos.stride(0), head_dim, rotary_dim);
  });
  return {rotated_query, rotated_key};
}
