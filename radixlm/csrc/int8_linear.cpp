// int8_linear: W8A8 linear with per-token activation scales. One pass quantizes
// each row of x to int8, at::_int_mm (oneDNN s8s8 -> s32) does the product, one
// pass applies both scales (and the bias); the passes are int8_body.h's, in the
// copy for the CPU's ISA level.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_int_mm.h>
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

#define RADIXLM_ISA_BODY "int8_body.h"
#include "isa_instantiate.h"
#undef RADIXLM_ISA_BODY

// Per-token symmetric int8: x [M, K] float/bf16 -> (xq [M, K] int8, scales [M] float32),
// x ~= xq * scales[:, None]. An all-zero row gets scale 1.
std::vector<at::Tensor> quantize_per_token(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2);
  auto xc = x.contiguous();
  const int64_t m = xc.size(0), k = xc.size(1);
  auto xq = at::empty({m, k}, xc.options().dtype(at::kChar));
  auto scales = at::empty({m}, xc.options().dtype(at::kFloat));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, xc.scalar_type(), "quantize", [&] {
    RADIXLM_ISA_FN(quantize_rows<scalar_t>)(xc.data_ptr<scalar_t>(), xq.data_ptr<int8_t>(),
                                            scales.data_ptr<float>(), m, k);
  });
  return {xq, scales};
}

// W8A8 linear: x [M, K] (float32 or bf16), w_t [K, N] int8 (a transposed view of
// the [N, K] weight or a contiguous [K, N] one), w_scales [N] float32, bias [N]
// float32 or undefined -> [M, N] in x's dtype.
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& w_t, const at::Tensor& w_scales,
                       const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && w_t.dim() == 2 && x.size(1) == w_t.size(0));
  TORCH_CHECK(w_t.scalar_type() == at::kChar && w_scales.scalar_type() == at::kFloat);
  auto q = quantize_per_token(x);
  auto acc = at::_int_mm(q[0], w_t);  // [M, N] int32
  const int64_t m = acc.size(0), n = acc.size(1);
  auto out = at::empty({m, n}, x.options());
  auto ws = w_scales.contiguous();
  at::Tensor b;
  if (bias.has_value() && bias->defined()) b = bias->to(at::kFloat).contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "dequantize", [&] {
    RADIXLM_ISA_FN(dequantize_rows<scalar_t>)(
        acc.data_ptr<int32_t>(), q[1].data_ptr<float>(), ws.data_ptr<float>(),
        b.defined() ? b.data_ptr<float>() : nullptr, out.data_ptr<scalar_t>(), m, n);
  });
  return out;
}

// quantize_per_token as the operator returns it.
std::tuple<at::Tensor, at::Tensor> quantize_per_token_op(const at::Tensor& x) {
  auto out = quantize_per_token(x);
  return {out[0], out[1]};
}
