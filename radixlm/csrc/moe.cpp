// moe_experts: a sparse mixture-of-experts MLP after its router, for the CPU
// (models/moe.py's SparseMoeBlock calls it, and so does the layer program).
//
// Routing is transformers': softmax of the router's logits in float32, the top k
// experts of each row, their weights renormalized to sum to 1 when
// norm_topk_prob, then cast to x's dtype. The rows are grouped by expert: each
// selected expert runs once, over all the rows routed to it (one matmul of many
// rows per weight, through prepared_linear whatever the weight's format), and an
// expert no row selected is never read, so a one-token decode step reads k
// experts' weights of E. Each row's weighted expert outputs are summed in
// float32, in ascending expert order, and cast to x's dtype once (as the torch
// loop in moe.py does, and as vLLM's and SGLang's fused MoE kernels accumulate):
// in bf16 a sum of k outputs rounds once, not k times.
#include <ATen/Dispatch.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros.h>
#include <ATen/record_function.h>
#include <torch/library.h>

#include "layer_ops.h"
#include "prepared_linear.h"

#include <cstring>
#include <tuple>
#include <vector>

namespace radixlm::layer_ops {

namespace {

at::Tensor int64_tensor(const std::vector<int64_t>& values) {
  at::Tensor t = at::empty({static_cast<int64_t>(values.size())}, at::kLong);
  std::memcpy(t.data_ptr<int64_t>(), values.data(), values.size() * sizeof(int64_t));
  return t;
}

// (weights [T, k] in x's dtype, expert ids [T, k] int64): SparseMoeBlock.route.
std::tuple<at::Tensor, at::Tensor> route(const at::Tensor& logits, int64_t top_k,
                                         bool norm_topk_prob, at::ScalarType dtype) {
  const at::Tensor probs = at::softmax(logits, -1, at::kFloat);  // [T, E]
  auto [weights, experts] = at::topk(probs, top_k, -1);          // [T, k] each
  if (norm_topk_prob) {
    weights = weights / weights.sum(-1, true);
  }
  return {weights.to(dtype), experts.contiguous()};
}

// sum[rows[i]] += weights[picks[i]] * y[i] for the n rows of one expert, in float32.
void accumulate(at::Tensor& sum, const at::Tensor& y, const float* weights,
                const std::vector<int64_t>& rows, const std::vector<int64_t>& picks) {
  const int64_t d = sum.size(1);
  float* out = sum.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, y.scalar_type(), "moe_accumulate", [&] {
    const scalar_t* src = y.data_ptr<scalar_t>();
    for (size_t i = 0; i < rows.size(); ++i) {
      const float w = weights[picks[i]];
      float* dst = out + rows[i] * d;
      const scalar_t* row = src + static_cast<int64_t>(i) * y.stride(0);
      for (int64_t j = 0; j < d; ++j) {
        dst[j] += w * static_cast<float>(row[j]);
      }
    }
  });
}

}  // namespace

at::Tensor moe_experts(const at::Tensor& x, const at::Tensor& logits, int64_t top_k,
                       bool norm_topk_prob, at::TensorList gate_up, at::TensorList down,
                       at::IntArrayRef gate_up_kinds, at::IntArrayRef down_kinds, int64_t act,
                       bool fused) {
  const int64_t num_experts = static_cast<int64_t>(gate_up.size());
  TORCH_CHECK(x.dim() == 2 && logits.dim() == 2 && logits.size(0) == x.size(0) &&
                  logits.size(1) == num_experts,
              "moe_experts: x [T, hidden] and logits [T, E] for E experts");
  TORCH_CHECK(static_cast<int64_t>(down.size()) == num_experts &&
                  static_cast<int64_t>(gate_up_kinds.size()) == num_experts &&
                  static_cast<int64_t>(down_kinds.size()) == num_experts,
              "moe_experts: a gate_up and a down weight, each with its kind, per expert");
  TORCH_CHECK(top_k >= 1 && top_k <= num_experts, "moe_experts: 1 <= top_k <= E");
  const auto [weights, experts] = route(logits, top_k, norm_topk_prob, x.scalar_type());
  // Per expert, the rows routed to it (ascending) and their (row, slot) in weights.
  std::vector<std::vector<int64_t>> rows(num_experts), picks(num_experts);
  const int64_t* ids = experts.data_ptr<int64_t>();
  for (int64_t i = 0; i < experts.numel(); ++i) {
    TORCH_CHECK(ids[i] >= 0 && ids[i] < num_experts, "moe_experts: an expert id out of range");
    rows[ids[i]].push_back(i / top_k);
    picks[ids[i]].push_back(i);
  }
  const at::Tensor flat_weights = weights.to(at::kFloat).contiguous();  // [T, k]
  at::Tensor sum = at::zeros({x.size(0), x.size(1)}, x.options().dtype(at::kFloat));
  for (int64_t e = 0; e < num_experts; ++e) {
    if (rows[e].empty()) {
      continue;  // never read
    }
    const at::Tensor index = int64_tensor(rows[e]);
    const at::Tensor gu = prepared_linear(x.index_select(0, index), gate_up[e], c10::nullopt,
                                          gate_up_kinds[e]);
    const at::Tensor y = prepared_linear(gated_act(gu, act, fused), down[e], c10::nullopt,
                                         down_kinds[e]);  // [n, hidden]
    accumulate(sum, y.contiguous(), flat_weights.data_ptr<float>(), rows[e], picks[e]);
  }
  return sum.to(x.scalar_type());
}

}  // namespace radixlm::layer_ops

namespace {

at::Tensor moe_experts_op(const at::Tensor& x, const at::Tensor& logits, int64_t top_k,
                          bool norm_topk_prob, at::TensorList gate_up, at::TensorList down,
                          at::IntArrayRef gate_up_kinds, at::IntArrayRef down_kinds, int64_t act,
                          bool fused) {
  RECORD_FUNCTION("radixlm::moe_experts", std::vector<c10::IValue>());
  return radixlm::layer_ops::moe_experts(x, logits, top_k, norm_topk_prob, gate_up, down,
                                         gate_up_kinds, down_kinds, act, fused);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def(
      "moe_experts(Tensor x, Tensor logits, int top_k, bool norm_topk_prob, Tensor[] gate_up, "
      "Tensor[] down, int[] gate_up_kinds, int[] down_kinds, int act, bool fused) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("moe_experts", &moe_experts_op); }
// oneDNN-packed experts are tensors of the MkldnnCPU backend.
TORCH_LIBRARY_IMPL(radixlm, MkldnnCPU, m) { m.impl("moe_experts", &moe_experts_op); }
