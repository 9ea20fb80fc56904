// moe_experts: a sparse mixture-of-experts MLP after its router, for the CPU
// (models/moe.py's SparseMoeBlock calls it, and so does the layer program).
//
// Routing is transformers': softmax of the router's logits in float32, the top k
// experts of each row, their weights renormalized to sum to 1 when
// norm_topk_prob, then cast to x's dtype (in a plain loop: route below). The rows are grouped by expert: each
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
#include <ATen/ops/zeros.h>
#include <ATen/record_function.h>
#include <torch/library.h>

#include "layer_ops.h"
#include "prepared_linear.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

namespace radixlm::layer_ops {

namespace {

at::Tensor int64_tensor(const std::vector<int64_t>& values) {
  at::Tensor t = at::empty({static_cast<int64_t>(values.size())}, at::kLong);
  std::memcpy(t.data_ptr<int64_t>(), values.data(), values.size() * sizeof(int64_t));
  return t;
}

// w as the nearest value of dtype (bf16, half or float32), back in float32.
float round_to(float w, at::ScalarType dtype) {
  if (dtype == at::kBFloat16) {
    return static_cast<float>(c10::BFloat16(w));
  }
  if (dtype == at::kHalf) {
    return static_cast<float>(c10::Half(w));
  }
  return w;
}

// SparseMoeBlock.route in one single-threaded pass over the [T, E] logits: per row,
// softmax in float32, the top k (the larger probability first, the lower expert
// on a tie), renormalized to sum to 1 when norm_topk_prob, each weight rounded to
// x's dtype as the Python route casts it. weights and experts: [T * k]. (ATen's
// softmax, topk, sum and casts were five operator calls a layer, each an OpenMP
// region on a few hundred numbers: on a busy 2-core machine ~5% of a 16-row step.)
void route(const at::Tensor& logits, int64_t top_k, bool norm_topk_prob, at::ScalarType dtype,
           std::vector<float>& weights, std::vector<int64_t>& experts) {
  const at::Tensor l = logits.to(at::kFloat).contiguous();
  const int64_t rows = l.size(0), num_experts = l.size(1);
  const float* src = l.data_ptr<float>();
  weights.resize(rows * top_k);
  experts.resize(rows * top_k);
  std::vector<float> probs(num_experts);
  std::vector<int64_t> order(num_experts);
  for (int64_t t = 0; t < rows; ++t) {
    const float* row = src + t * num_experts;
    const float max = *std::max_element(row, row + num_experts);
    float sum = 0.0f;
    for (int64_t e = 0; e < num_experts; ++e) {
      probs[e] = std::exp(row[e] - max);
      sum += probs[e];
    }
    for (float& p : probs) {  // a NaN row (a broken model) orders without UB: NaN out
      p = std::isnan(p) ? -1.0f : p;
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                      [&](int64_t a, int64_t b) {
                        return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
                      });
    float picked = 0.0f;
    for (int64_t j = 0; j < top_k; ++j) {
      picked += probs[order[j]] / sum;
    }
    for (int64_t j = 0; j < top_k; ++j) {
      float w = probs[order[j]] / sum;
      if (norm_topk_prob) {
        w /= picked;
      }
      weights[t * top_k + j] = round_to(w, dtype);
      experts[t * top_k + j] = order[j];
    }
  }
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
  std::vector<float> weights;
  std::vector<int64_t> ids;
  route(logits, top_k, norm_topk_prob, x.scalar_type(), weights, ids);
  // Per expert, the rows routed to it (ascending) and their (row, slot) in weights.
  std::vector<std::vector<int64_t>> rows(num_experts), picks(num_experts);
  for (size_t i = 0; i < ids.size(); ++i) {
    rows[ids[i]].push_back(static_cast<int64_t>(i) / top_k);
    picks[ids[i]].push_back(static_cast<int64_t>(i));
  }
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
    accumulate(sum, y.contiguous(), weights.data(), rows[e], picks[e]);
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
