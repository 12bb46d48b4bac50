// Fused CPU versions of the small per-layer ops: rms_norm, fused add + rms_norm, silu_and_mul and rotary
// (neox or gpt-j pairs, partial). Each is one pass over its rows instead of the 3-9 ATen ops the torch
// reference chains, which at decode sizes is mostly per-op dispatch cost. Every intermediate is rounded
// to the tensor dtype exactly where the reference rounds (each ATen op rounds its result), so outputs
// equal torch_ref's up to the order of the fp32 sum of squares. Rows run in parallel (at::parallel_for).
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cmath>

// No fused multiply-adds here: a*b - c*d must round each product as the reference's separate ATen ops do
// (in fp32 too, where `rounded` is the identity), or rotary outputs drift by an ulp from torch_ref's.
#pragma GCC optimize("fp-contract=off")

namespace {

constexpr int64_t kRowsPerTask = 16;

template <typename T>
inline float rounded(float value) {
  return static_cast<float>(static_cast<T>(value));
}

template <typename T>
void normalize_row(const T* x, const T* weight, T* out, int64_t hidden, float eps) {
  float sum_squares = 0.0f;
  for (int64_t i = 0; i < hidden; ++i) {
    const float value = static_cast<float>(x[i]);
    sum_squares += value * value;
  }
  const float inverse_rms = 1.0f / std::sqrt(sum_squares / static_cast<float>(hidden) + eps);
  for (int64_t i = 0; i < hidden; ++i) {
    const float normalized = rounded<T>(static_cast<float>(x[i]) * inverse_rms);
    out[i] = static_cast<T>(static_cast<float>(weight[i]) * normalized);
  }
}

void check_rows(const torch::Tensor& x, const char* what) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.stride(1) == 1, what, ": CPU [rows, width] tensor with ",
              "contiguous rows expected");
}

void check_weight(const torch::Tensor& weight, const torch::Tensor& x) {
  TORCH_CHECK(weight.dim() == 1 && weight.is_contiguous() && weight.size(0) == x.size(1) &&
                  weight.scalar_type() == x.scalar_type(),
              "rms_norm: weight must be a contiguous [width] tensor in the input's dtype");
}

}  // namespace

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  check_rows(x, "rms_norm");
  check_weight(weight, x);
  auto out = torch::empty(x.sizes(), x.options());
  const int64_t rows = x.size(0), hidden = x.size(1), stride = x.stride(0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    const scalar_t* src = x.data_ptr<scalar_t>();
    const scalar_t* w = weight.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row)
        normalize_row(src + row * stride, w, dst + row * hidden, hidden, static_cast<float>(eps));
    });
  });
  return out;
}

std::vector<torch::Tensor> fused_add_rms_norm(const torch::Tensor& x, const torch::Tensor& residual,
                                              const torch::Tensor& weight, double eps) {
  check_rows(x, "fused_add_rms_norm");
  check_rows(residual, "fused_add_rms_norm residual");
  check_weight(weight, x);
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type(),
              "fused_add_rms_norm: residual must match x");
  auto out = torch::empty(x.sizes(), x.options());
  auto summed = torch::empty(x.sizes(), x.options());
  const int64_t rows = x.size(0), hidden = x.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fused_add_rms_norm", [&] {
    const scalar_t* a = x.data_ptr<scalar_t>();
    const scalar_t* b = residual.data_ptr<scalar_t>();
    const scalar_t* w = weight.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    scalar_t* sum = summed.data_ptr<scalar_t>();
    at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const scalar_t* a_row = a + row * x.stride(0);
        const scalar_t* b_row = b + row * residual.stride(0);
        scalar_t* sum_row = sum + row * hidden;
        for (int64_t i = 0; i < hidden; ++i)
          sum_row[i] = static_cast<scalar_t>(static_cast<float>(a_row[i]) + static_cast<float>(b_row[i]));
        normalize_row(sum_row, w, dst + row * hidden, hidden, static_cast<float>(eps));
      }
    });
  });
  return {out, summed};
}

torch::Tensor silu_and_mul(const torch::Tensor& x) {
  check_rows(x, "silu_and_mul");
  TORCH_CHECK(x.size(1) % 2 == 0, "silu_and_mul: the width must be even ([gate | up])");
  const int64_t rows = x.size(0), width = x.size(1) / 2;
  auto out = torch::empty({rows, width}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "silu_and_mul", [&] {
    const scalar_t* src = x.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const scalar_t* gate = src + row * x.stride(0);
        const scalar_t* up = gate + width;
        for (int64_t i = 0; i < width; ++i) {
          const float g = static_cast<float>(gate[i]);
          const float activated = rounded<scalar_t>(g / (1.0f + std::exp(-g)));
          dst[row * width + i] = static_cast<scalar_t>(activated * static_cast<float>(up[i]));
        }
      }
    });
  });
  return out;
}

namespace {

// Rotates one [rows, heads * head_dim] tensor into `out` (contiguous, same shape).
template <typename T>
void rotate(const torch::Tensor& x, torch::Tensor& out, const T* cos, const T* sin, int64_t table_stride,
            int64_t head_dim, int64_t rotary_dim, bool is_neox_style) {
  const int64_t rows = x.size(0), width = x.size(1), heads = width / head_dim, half = rotary_dim / 2;
  const T* src = x.data_ptr<T>();
  T* dst = out.data_ptr<T>();
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const T* c = cos + row * table_stride;
      const T* s = sin + row * table_stride;
      for (int64_t head = 0; head < heads; ++head) {
        const T* in = src + row * x.stride(0) + head * head_dim;
        T* o = dst + row * width + head * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          const int64_t first = is_neox_style ? i : 2 * i, second = is_neox_style ? i + half : 2 * i + 1;
          const float x1 = static_cast<float>(in[first]), x2 = static_cast<float>(in[second]);
          const float ci = static_cast<float>(c[i]), si = static_cast<float>(s[i]);
          // (x1 cos - x2 sin, x2 cos + x1 sin), each product and the sum rounded as the reference does.
          o[first] = static_cast<T>(rounded<T>(x1 * ci) - rounded<T>(x2 * si));
          o[second] = static_cast<T>(rounded<T>(x2 * ci) + rounded<T>(x1 * si));
        }
        for (int64_t i = rotary_dim; i < head_dim; ++i) o[i] = in[i];
      }
    }
  });
}

}  // namespace

std::vector<torch::Tensor> rotary_embedding(const torch::Tensor& query, const torch::Tensor& key,
                                            const torch::Tensor& cos, const torch::Tensor& sin, int64_t head_dim,
                                            int64_t rotary_dim, bool is_neox_style) {
  check_rows(query, "rotary_embedding query");
  check_rows(key, "rotary_embedding key");
  TORCH_CHECK(key.size(0) == query.size(0) && key.scalar_type() == query.scalar_type() &&
                  query.size(1) % head_dim == 0 && key.size(1) % head_dim == 0 && rotary_dim <= head_dim &&
                  rotary_dim % 2 == 0,
              "rotary_embedding: query/key rows must hold whole heads of head_dim >= rotary_dim (even)");
  TORCH_CHECK(cos.dim() == 3 && cos.stride(2) == 1 && sin.strides() == cos.strides() &&
                  cos.size(2) == rotary_dim / 2 && cos.scalar_type() == query.scalar_type(),
              "rotary_embedding: cos/sin [rows, 1, rotary_dim / 2] in the query's dtype expected");
  auto rotated_query = torch::empty(query.sizes(), query.options());
  auto rotated_key = torch::empty(key.sizes(), key.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "rotary_embedding", [&] {
    const scalar_t* c = cos.data_ptr<scalar_t>();
    const scalar_t* s = sin.data_ptr<scalar_t>();
    rotate<scalar_t>(query, rotated_query, c, s, cos.stride(0), head_dim, rotary_dim, is_neox_style);
    rotate<scalar_t>(key, rotated_key, c, s, cos.stride(0), head_dim, rotary_dim, is_neox_style);
  });
  return {rotated_query, rotated_key};
}
