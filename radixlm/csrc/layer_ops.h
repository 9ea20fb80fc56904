// The steps of a decoder layer as the C++ layer program runs them (layer_program.cpp)
// and as the MoE kernel reuses them (moe.cpp): each is the kernel the Python layers
// call in the same case, or torch's operators spelled as layers/*.py spell them, so
// a step here gives the Python step's result bit for bit.
//
// fused: the fused elementwise kernels where the Python layers take them
// (cpu_kernels.use_fused_cpu_kernel: bf16, and float32 in the bf16_weights mode).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <tuple>

namespace radixlm::layer_ops {

// Gated activations over x = [gate | up] (layers/activation.py).
constexpr int64_t kSiluMul = 0;      // SiluAndMul
constexpr int64_t kGeluTanhMul = 1;  // GeluTanhAndMul

// RMSNorm.forward: rms_norm over the last dimension (a row, or each head of [T, n, D]).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// RMSNorm.add_and_norm: (norm(x + residual), x + residual).
std::tuple<at::Tensor, at::Tensor> add_and_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps, bool fused);

// rotary.apply_rotary: x [T, n, D] by cos, sin [T, 1, R / 2]; R < D rotates the first R
// features of each head.
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool fused);

// act(x[:, :d]) * x[:, d:] for x [T, 2d] (act: kSiluMul, kGeluTanhMul).
at::Tensor gated_act(const at::Tensor& x, int64_t act, bool fused);

// SparseMoeBlock's experts after its router (moe.cpp): top-k of softmax(logits), then
// each selected expert once over the rows routed to it.
at::Tensor moe_experts(const at::Tensor& x, const at::Tensor& logits, int64_t top_k,
                       bool norm_topk_prob, at::TensorList gate_up, at::TensorList down,
                       at::IntArrayRef gate_up_kinds, at::IntArrayRef down_kinds, int64_t act,
                       bool fused);

}  // namespace radixlm::layer_ops
