// prepared_linear (prepared_linear.h): the kernel of each prepared-weight kind, each
// call in a profiler scope named for its kernel.
#include "prepared_linear.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/record_function.h>
#include <torch/library.h>

#include <string>
#include <vector>

// The kernels (bf16_gemm.cpp, bf16w_gemm.cpp; quant/quant_linear.cpp below).
at::Tensor bf16_pairs_linear(const at::Tensor& x, const at::Tensor& packed,
                             const c10::optional<at::Tensor>& bias);
at::Tensor bf16w_linear(const at::Tensor& x, const at::Tensor& packed,
                        const c10::optional<at::Tensor>& bias);

namespace radixlm {
namespace quant {
at::Tensor q_linear(const at::Tensor& x, const at::Tensor& blob,
                    const c10::optional<at::Tensor>& bias, bool out_float32);  // quant_linear.cpp
}  // namespace quant

at::Tensor prepared_linear(const at::Tensor& x, const at::Tensor& w,
                           const c10::optional<at::Tensor>& bias, int64_t kind) {
  if (kind == kPreparedPairs && x.scalar_type() == at::kFloat) {
    RECORD_FUNCTION("radixlm::bf16w_linear", std::vector<c10::IValue>());
    return bf16w_linear(x, w, bias);
  }
  if (kind == kPreparedPairs) {
    RECORD_FUNCTION("radixlm::bf16_pairs_linear", std::vector<c10::IValue>());
    return bf16_pairs_linear(x, w, bias);
  }
  if (kind == kPreparedQuant) {
    RECORD_FUNCTION("radixlm::q_linear", std::vector<c10::IValue>());
    return quant::q_linear(x, w, bias, false);
  }
  TORCH_CHECK(kind == kPreparedOneDnn, "prepared_linear: unknown weight kind ", kind);
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  torch::jit::Stack stack{x, w, bias.has_value() ? c10::IValue(*bias) : c10::IValue(),
                          c10::IValue(std::string("none")),
                          c10::IValue(c10::impl::GenericList(
                              c10::OptionalType::create(c10::NumberType::get()))),
                          c10::IValue()};
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

}  // namespace radixlm

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("prepared_linear(Tensor x, Tensor w, Tensor? bias, int kind) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("prepared_linear", &radixlm::prepared_linear); }
// oneDNN-packed weights are tensors of the MkldnnCPU backend.
TORCH_LIBRARY_IMPL(radixlm, MkldnnCPU, m) { m.impl("prepared_linear", &radixlm::prepared_linear); }
