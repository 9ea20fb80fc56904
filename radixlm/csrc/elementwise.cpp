// silu_and_mul, add_rms_norm and rotary_embedding: the torch-facing glue around
// elementwise_body.h, whose copy for the CPU's ISA level does the work.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "isa.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#define RADIXLM_ISA_BODY "elementwise_body.h"
#include "isa_instantiate.h"
#undef RADIXLM_ISA_BODY

namespace {

void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.stride(1) == 1,
              name, ": a CPU tensor [T, d] with contiguous rows");
}

}  // namespace

// x [T, 2d] (rows may be strided) -> silu(x[:, :d]) * x[:, d:], [T, d].
at::Tensor silu_and_mul(const at::Tensor& x) {
  check_rows(x, "silu_and_mul");
  TORCH_CHECK(x.size(1) % 2 == 0, "silu_and_mul: an even last dimension");
  const int64_t rows = x.size(0), d = x.size(1) / 2;
  auto out = at::empty({rows, d}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "silu_and_mul", [&] {
    RADIXLM_ISA_FN(silu_and_mul_rows<scalar_t>)(x.data_ptr<scalar_t>(), x.stride(0),
                                                out.data_ptr<scalar_t>(), rows, d);
  });
  return out;
}

// x [T, d] (rows may be strided), residual [T, d] contiguous, weight [d] ->
// (rms_norm(x + residual) * weight, x + residual), each [T, d]: the pre-norm block's
// normed input and residual stream.
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps) {
  check_rows(x, "add_rms_norm");
  TORCH_CHECK(residual.is_contiguous() && residual.sizes() == x.sizes() &&
                  residual.scalar_type() == x.scalar_type(),
              "add_rms_norm: residual must be a contiguous tensor like x");
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == x.size(1) &&
                  weight.scalar_type() == x.scalar_type(),
              "add_rms_norm: weight [d] in x's dtype");
  const int64_t rows = x.size(0), d = x.size(1);
  auto out = at::empty({rows, d}, x.options());
  auto sum = at::empty({rows, d}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rms_norm", [&] {
    RADIXLM_ISA_FN(add_rms_norm_rows<scalar_t>)(
        x.data_ptr<scalar_t>(), x.stride(0), residual.data_ptr<scalar_t>(),
        sum.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), rows, d,
        static_cast<float>(eps));
  });
  return {out, sum};
}

// x [M, K] (M <= kSmallBatchRows, rows may be strided), w [N, K] contiguous, bias [N]
// or undefined -> x w^T + bias, [M, N]. A decode step of one or two requests is a
// matrix-vector product that only streams the weight: each thread walks its rows of
// w once, in order, converting 32 elements at a time and multiplying them into
// every row of x. oneDNN's packed bfloat16 kernel reached ~60% of the memory

// x [T, n, D] (tokens may be strided; heads and dims contiguous), cos and sin
// [T, 1, D / 2] (last dim contiguous) -> x rotated, [T, n, D] contiguous.
at::Tensor rotary_embedding(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 3 && x.stride(2) == 1 &&
                  x.stride(1) == x.size(2) && x.size(2) % 2 == 0,
              "rotary_embedding: a CPU tensor [T, n, D] with contiguous heads, D even");
  const int64_t tokens = x.size(0), heads = x.size(1), d = x.size(2);
  for (const auto* t : {&cos, &sin}) {
    TORCH_CHECK(t->dim() == 3 && t->size(0) == tokens && t->size(2) == d / 2 &&
                    t->stride(2) == 1 && t->scalar_type() == x.scalar_type(),
                "rotary_embedding: cos and sin [T, 1, D / 2] in x's dtype");
  }
  TORCH_CHECK(cos.stride(0) == sin.stride(0), "rotary_embedding: cos and sin strided alike");
  auto out = at::empty({tokens, heads, d}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rotary", [&] {
    RADIXLM_ISA_FN(rotary_rows<scalar_t>)(x.data_ptr<scalar_t>(), x.stride(0),
                                          cos.data_ptr<scalar_t>(), sin.data_ptr<scalar_t>(),
                                          cos.stride(0), out.data_ptr<scalar_t>(), tokens, heads,
                                          d);
  });
  return out;
}

