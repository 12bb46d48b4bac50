// silu(gate) * up over x = [..., 2 * d] = [gate | up]: the example CUDA op of the JIT extension path.
// One thread per output element, fp32 math, grid-stride loop; rows are contiguous.
#include <torch/extension.h>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

namespace {

template <typename T>
__global__ void silu_and_mul_kernel(T* __restrict__ out, const T* __restrict__ x, int64_t rows, int64_t d) {
  const int64_t total = rows * d;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / d, column = i % d;
    const float gate = static_cast<float>(x[row * 2 * d + column]);
    const float up = static_cast<float>(x[row * 2 * d + d + column]);
    out[i] = static_cast<T>(gate / (1.0f + __expf(-gate)) * up);
  }
}

}  // namespace

void silu_and_mul(torch::Tensor out, const torch::Tensor& x) {
  TORCH_CHECK(x.is_cuda() && out.is_cuda() && x.is_contiguous() && out.is_contiguous(),
              "silu_and_mul: contiguous CUDA tensors expected");
  TORCH_CHECK(x.size(-1) % 2 == 0 && out.size(-1) * 2 == x.size(-1) && out.scalar_type() == x.scalar_type(),
              "silu_and_mul: out must be [..., d] of x's dtype for x [..., 2 * d]");
  const at::cuda::CUDAGuard guard(x.device());
  const int64_t d = out.size(-1), rows = out.numel() / std::max<int64_t>(d, 1);
  if (out.numel() == 0) return;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((out.numel() + threads - 1) / threads, 65535);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "silu_and_mul", [&] {
    silu_and_mul_kernel<scalar_t><<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        out.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), rows, d);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("silu_and_mul", &silu_and_mul, "silu(gate) * up (CUDA)");
}
