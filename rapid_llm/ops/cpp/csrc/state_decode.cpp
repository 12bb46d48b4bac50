// Decode steps of the recurrent state ops (CPU): one token per sequence, each state row updated in place.
// The torch forms gather a step's state rows, update the copy and scatter it back (some ten passes over rows of
// up to 64 KiB per head); here one thread owns a (sequence, head) and reads and writes its rows once or twice,
// the inner loops over a contiguous state row left to the compiler's vectoriser. float32 throughout, as the
// states are; the Python wrappers (ops/cpp/cpu_state.py) hand in contiguous float32 inputs.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <vector>

namespace {

void check_inputs(const char* op, const at::Tensor& state, const at::Tensor& slots,
                  std::initializer_list<const at::Tensor*> inputs) {
  TORCH_CHECK(state.scalar_type() == at::kFloat && state.dim() == 4, op, ": the state must be float32 [rows, heads, ",
              "dim, dim]");
  TORCH_CHECK(state.stride(3) == 1 && state.stride(2) == state.size(3) && state.stride(1) == state.size(2) * state.size(3),
              op, ": each state row must be contiguous");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.dim() == 1 && slots.is_contiguous(), op,
              ": slots must be a contiguous int64 vector");
  for (const at::Tensor* input : inputs) {
    TORCH_CHECK(input->scalar_type() == at::kFloat && input->is_contiguous(), op, ": inputs must be contiguous float32");
  }
}

}  // namespace

// S = S exp(dt A) + dt x (outer) B; y = S C + D x, per head (P x N state; B, C shared by a group of heads).
at::Tensor ssd_scan_decode(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A, const at::Tensor& B,
                           const at::Tensor& C, const at::Tensor& D, at::Tensor state, const at::Tensor& slots) {
  check_inputs("ssd_scan_decode", state, slots, {&x, &dt, &A, &B, &C, &D});
  const int64_t seqs = x.size(0), heads = x.size(1), head_dim = x.size(2), groups = B.size(1), state_dim = B.size(2);
  TORCH_CHECK(state.size(1) == heads && state.size(2) == head_dim && state.size(3) == state_dim && slots.size(0) == seqs,
              "ssd_scan_decode: the state [", state.size(0), ", ", state.size(1), ", ", state.size(2), ", ",
              state.size(3), "] does not match the inputs");
  at::Tensor y = at::empty_like(x);
  const float *xs = x.data_ptr<float>(), *dts = dt.data_ptr<float>(), *as = A.data_ptr<float>();
  const float *bs = B.data_ptr<float>(), *cs = C.data_ptr<float>(), *ds = D.data_ptr<float>();
  const int64_t* rows = slots.data_ptr<int64_t>();
  float *states = state.data_ptr<float>(), *ys = y.data_ptr<float>();
  const int64_t per_group = heads / groups, row_stride = state.stride(0);
  at::parallel_for(0, seqs * heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t seq = item / heads, head = item % heads, group = head / per_group;
      const float step = dts[item], decay = std::exp(step * as[head]), skip = ds[head];
      const float* b = bs + (seq * groups + group) * state_dim;
      const float* c = cs + (seq * groups + group) * state_dim;
      const float* xh = xs + item * head_dim;
      float* matrix = states + rows[seq] * row_stride + head * head_dim * state_dim;
      float* out = ys + item * head_dim;
      for (int64_t p = 0; p < head_dim; ++p) {
        const float written = step * xh[p];
        float* row = matrix + p * state_dim;
        float sum = 0.f;
        for (int64_t n = 0; n < state_dim; ++n) {
          const float value = row[n] * decay + written * b[n];
          row[n] = value;
          sum += value * c[n];
        }
        out[p] = sum + skip * xh[p];
      }
    }
  });
  return y;
}

// S = S exp(g); S += k (beta (v - S^T k))^T; o = S^T q, per value head (Dk x Dv state; q, k shared by a group).
at::Tensor gated_delta_rule_decode(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                   const at::Tensor& g, const at::Tensor& beta, at::Tensor state,
                                   const at::Tensor& slots) {
  check_inputs("gated_delta_rule_decode", state, slots, {&query, &key, &value, &g, &beta});
  const int64_t seqs = value.size(0), value_heads = value.size(1), value_dim = value.size(2);
  const int64_t key_heads = key.size(1), key_dim = key.size(2);
  TORCH_CHECK(state.size(1) == value_heads && state.size(2) == key_dim && state.size(3) == value_dim &&
                  slots.size(0) == seqs,
              "gated_delta_rule_decode: the state [", state.size(0), ", ", state.size(1), ", ", state.size(2), ", ",
              state.size(3), "] does not match the inputs");
  at::Tensor output = at::empty_like(value);
  const float *qs = query.data_ptr<float>(), *ks = key.data_ptr<float>(), *vs = value.data_ptr<float>();
  const float *gs = g.data_ptr<float>(), *betas = beta.data_ptr<float>();
  const int64_t* rows = slots.data_ptr<int64_t>();
  float *states = state.data_ptr<float>(), *outs = output.data_ptr<float>();
  const int64_t per_key_head = value_heads / key_heads, row_stride = state.stride(0);
  at::parallel_for(0, seqs * value_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> delta(value_dim);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t seq = item / value_heads, head = item % value_heads;
      const int64_t key_head = seq * key_heads + head / per_key_head;
      const float decay = std::exp(gs[item]), strength = betas[item];
      const float *q = qs + key_head * key_dim, *k = ks + key_head * key_dim, *v = vs + item * value_dim;
      float* matrix = states + rows[seq] * row_stride + head * key_dim * value_dim;
      float* out = outs + item * value_dim;
      // delta = beta (v - (S exp(g))^T k): one read of S.
      for (int64_t j = 0; j < value_dim; ++j) delta[j] = 0.f;
      for (int64_t i = 0; i < key_dim; ++i) {
        const float weight = k[i] * decay;
        const float* row = matrix + i * value_dim;
        for (int64_t j = 0; j < value_dim; ++j) delta[j] += weight * row[j];
      }
      for (int64_t j = 0; j < value_dim; ++j) {
        delta[j] = strength * (v[j] - delta[j]);
        out[j] = 0.f;
      }
      // S = S exp(g) + k delta^T and o = S^T q: one read and one write of S.
      for (int64_t i = 0; i < key_dim; ++i) {
        const float ki = k[i], qi = q[i];
        float* row = matrix + i * value_dim;
        for (int64_t j = 0; j < value_dim; ++j) {
          const float updated = row[j] * decay + ki * delta[j];
          row[j] = updated;
          out[j] += qi * updated;
        }
      }
    }
  });
  return output;
}
