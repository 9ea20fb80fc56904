// small_batch_linear: a linear layer of 1-2 rows (bfloat16/half), streaming the
// plain weight once at close to the memory bandwidth (small_batch_body.h, in the
// copy for the CPU's ISA level).
//
// x [M, K] (M <= kSmallBatchRows, rows may be strided), w [N, K] contiguous, bias [N]
// or undefined -> x w^T + bias, [M, N]. A decode step of one or two requests is a
// matrix-vector product that only streams the weight: each thread walks its rows of
// w once, in order, converting 32 elements at a time and multiplying them into
// every row of x. oneDNN's packed bfloat16 kernel reached ~60% of the memory
// bandwidth at one row; this reaches ~90% (1.45x at one row and at two; at three
// rows the two are even, from four on oneDNN's bf16 dot products win).
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

namespace radixlm {

constexpr int64_t kSmallBatchRows = 2;
constexpr int64_t kSmallBatchStep = 32;

}  // namespace radixlm

#define RADIXLM_ISA_BODY "small_batch_body.h"
#include "isa_instantiate.h"
#undef RADIXLM_ISA_BODY

using radixlm::kSmallBatchRows;
using radixlm::kSmallBatchStep;

at::Tensor small_batch_linear(const at::Tensor& x, const at::Tensor& w,
                              const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && w.dim() == 2 && w.is_contiguous() &&
                  x.size(1) == w.size(1) && x.scalar_type() == w.scalar_type(),
              "small_batch_linear: x [M, K] and a contiguous w [N, K] of one dtype");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(M >= 1 && M <= kSmallBatchRows && K % kSmallBatchStep == 0,
              "small_batch_linear: 1 or 2 rows, K a multiple of 32");
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = bias->contiguous();
    TORCH_CHECK(b.numel() == N && b.scalar_type() == x.scalar_type(),
                "small_batch_linear: bias [N]");
  }
  auto xf = x.to(at::kFloat).contiguous();
  auto out = at::empty({M, N}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "small_batch", [&] {
    RADIXLM_ISA_FN(small_batch_impl<scalar_t>)(xf.data_ptr<float>(), M, K,
                                               w.data_ptr<scalar_t>(),
                                               b.defined() ? b.data_ptr<scalar_t>() : nullptr,
                                               out.data_ptr<scalar_t>(), N);
  });
  return out;
}
