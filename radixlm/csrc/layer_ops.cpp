// The steps of layer_ops.h: each the kernel or the torch operators the Python layers
// use in the same case (the conditions below are theirs), each kernel call in a
// profiler scope of its operator's name.
#include "layer_ops.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/rms_norm.h>
#include <ATen/ops/silu.h>
#include <ATen/record_function.h>

#include <vector>

// The fused kernels (elementwise.cpp).
at::Tensor silu_and_mul(const at::Tensor& x);
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps);
at::Tensor rotary_embedding(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

namespace radixlm::layer_ops {

namespace {

// cpu_kernels.use_fused_cpu_kernel(x) without fuse_float32: bf16 and half.
bool half_width(const at::Tensor& x) {
  return x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf;
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return at::rms_norm(x, {x.size(-1)}, weight, eps);
}

std::tuple<at::Tensor, at::Tensor> add_and_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps, bool fused) {
  if (fused && x.dim() == 2 && residual.scalar_type() == x.scalar_type() &&
      weight.scalar_type() == x.scalar_type()) {
    RECORD_FUNCTION("radixlm::add_rms_norm", std::vector<c10::IValue>());
    return add_rms_norm(x, residual.contiguous(), weight, eps);
  }
  at::Tensor sum = x + residual;
  return {rms_norm(sum, weight, eps), sum};
}

at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool fused) {
  const int64_t rotary_dim = 2 * cos.size(-1);
  if (rotary_dim < x.size(-1)) {  // partial: apply_rotary's recursion, without fuse_float32
    const at::Tensor rotated = rotate(x.narrow(-1, 0, rotary_dim), cos, sin, half_width(x));
    return at::cat({rotated, x.narrow(-1, rotary_dim, x.size(-1) - rotary_dim)}, -1);
  }
  if (fused && x.stride(2) == 1 && x.stride(1) == x.size(2) &&
      cos.scalar_type() == x.scalar_type()) {
    RECORD_FUNCTION("radixlm::rotary_embedding", std::vector<c10::IValue>());
    return rotary_embedding(x, cos, sin);
  }
  const auto halves = x.chunk(2, -1);
  const at::Tensor &x1 = halves[0], &x2 = halves[1];
  return at::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
}

at::Tensor gated_act(const at::Tensor& x, int64_t act, bool fused) {
  if (act == kSiluMul && fused && x.dim() == 2) {
    RECORD_FUNCTION("radixlm::silu_and_mul", std::vector<c10::IValue>());
    return silu_and_mul(x);
  }
  const auto halves = x.chunk(2, -1);
  if (act == kSiluMul) {
    return at::silu(halves[0]) * halves[1];
  }
  TORCH_CHECK(act == kGeluTanhMul, "gated_act: unknown activation ", act);
  return at::gelu(halves[0], "tanh") * halves[1];
}

}  // namespace radixlm::layer_ops
