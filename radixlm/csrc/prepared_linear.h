// One entry for x W^T + b over any prepared weight (layers/prepared_weight.py):
// the C++ layer stack calls it for every projection, whatever its format.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <cstdint>

namespace radixlm {

// How a weight is prepared: PreparedWeight.cpp_kind.
constexpr int64_t kPreparedPairs = 0;   // bf16 pairs (bf16_gemm.cpp, bf16w_gemm.cpp)
constexpr int64_t kPreparedOneDnn = 1;  // oneDNN-packed float32 / bfloat16
constexpr int64_t kPreparedQuant = 2;   // GGUF block formats (quant/)

// x [M, K] -> [M, N] in x's dtype. kPreparedPairs: bf16 arithmetic for a bf16 x,
// float32 over the bf16 weights for a float32 x.
at::Tensor prepared_linear(const at::Tensor& x, const at::Tensor& w,
                           const c10::optional<at::Tensor>& bias, int64_t kind);

}  // namespace radixlm
