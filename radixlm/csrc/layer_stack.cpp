// The decoder layers of a Llama-family model in one call, for CPU steps whose
// linear layers are all packed (bf16 pairs or oneDNN) and whose attention is all
// in paged_attention.
//
// The Python loop over layers spends ~150 us a layer outside the kernels (module
// calls, argument checks, ~15 operator calls from Python): with 30 layers ~5 ms
// of a 17 ms one-request bf16 decode step. Here the same kernels and operators
// run in the same order on the same arguments, called from C++ (each kernel in a
// profiler scope of its operator's name), so the result
// is bit for bit the Python loop's (tests/models/test_layer_stack.py) at a
// fraction of the overhead: bf16 steps (and float32 ones over bf16 weights) with
// the fused elementwise kernels (silu_and_mul, add_rms_norm, rotary_embedding),
// exact float32 steps with torch's operators as layers/*.py spell them (the exact
// mode stays what transformers computes). models/layer_stack.py decides when a
// step may take this path and whether it is fused.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/stack.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/rms_norm.h>
#include <ATen/ops/silu.h>
#include <ATen/record_function.h>
#include <torch/library.h>

#include "prepared_linear.h"

#include <tuple>
#include <vector>

// The kernels (ops.h lists their files; every linear layer through prepared_linear.h).
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                           const at::Tensor& req_to_token, const at::Tensor& req_rows,
                           const at::Tensor& seq_lens, const at::Tensor& q_starts,
                           const at::Tensor& q_lens, double scale);
at::Tensor silu_and_mul(const at::Tensor& x);
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps);
at::Tensor rotary_embedding(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
void kv_store(at::Tensor k_buf, at::Tensor v_buf, const at::Tensor& loc, const at::Tensor& k,
              const at::Tensor& v);

namespace {

constexpr int64_t kNorms = 2;    // per layer: input_layernorm, post_attention_layernorm
constexpr int64_t kLinears = 4;  // per layer: qkv, o, gate_up, down
// (norm(x + residual), x + residual): the fused kernel, or RMSNorm.add_and_norm's
// torch operators.
std::tuple<at::Tensor, at::Tensor> add_and_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps, bool fused) {
  if (fused) {
    RECORD_FUNCTION("radixlm::add_rms_norm", std::vector<c10::IValue>());
    return add_rms_norm(x, residual.contiguous(), weight, eps);
  }
  at::Tensor sum = x + residual;
  return {at::rms_norm(sum, {sum.size(1)}, weight, eps), sum};
}

// layers/rotary.apply_rotary.
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool fused) {
  if (fused) {
    RECORD_FUNCTION("radixlm::rotary_embedding", std::vector<c10::IValue>());
    return rotary_embedding(x, cos, sin);
  }
  const auto halves = x.chunk(2, -1);
  const at::Tensor &x1 = halves[0], &x2 = halves[1];
  return at::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
}

// layers/activation.SiluAndMul.
at::Tensor silu_mul(const at::Tensor& x, bool fused) {
  if (fused) {
    RECORD_FUNCTION("radixlm::silu_and_mul", std::vector<c10::IValue>());
    return silu_and_mul(x);
  }
  const auto halves = x.chunk(2, -1);
  return at::silu(halves[0]) * halves[1];
}

}  // namespace

// hidden [T, hidden] bf16 or float32 (the embeddings); cos, sin [T, 1, D / 2] in
// hidden's dtype; per layer l:
// norms[2l .. 2l + 2), packed, biases and kinds [4l .. 4l + 4) (prepared_linear.h's
// kinds), k_bufs[l], v_bufs[l]; fused: the fused elementwise kernels; the
// attention arguments of paged_attention for every row of the step. Writes each
// layer's K and V at out_cache_loc and returns (hidden, residual) after the last
// layer, which the final norm adds: what LlamaModel's loop returns.
std::tuple<at::Tensor, at::Tensor> llama_layer_stack(
    const at::Tensor& hidden_in, const at::Tensor& cos, const at::Tensor& sin, at::TensorList norms, at::TensorList packed,
    const c10::List<c10::optional<at::Tensor>>& biases, at::IntArrayRef kinds,
    at::TensorList k_bufs,
    at::TensorList v_bufs, const at::Tensor& out_cache_loc, const at::Tensor& req_to_token,
    const at::Tensor& req_rows, const at::Tensor& seq_lens, const at::Tensor& q_starts,
    const at::Tensor& q_lens, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
    double eps, double scale, bool fused) {
  const int64_t layers = static_cast<int64_t>(k_bufs.size());
  TORCH_CHECK(static_cast<int64_t>(v_bufs.size()) == layers &&
                  static_cast<int64_t>(norms.size()) == kNorms * layers &&
                  static_cast<int64_t>(packed.size()) == kLinears * layers &&
                  static_cast<int64_t>(biases.size()) == kLinears * layers &&
                  static_cast<int64_t>(kinds.size()) == kLinears * layers,
              "llama_layer_stack: 2 norms, 4 linear layers and a K and V buffer per layer");
  TORCH_CHECK(hidden_in.dim() == 2, "llama_layer_stack: hidden [T, hidden]");
  const int64_t tokens = hidden_in.size(0);
  const int64_t q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
  at::Tensor hidden = hidden_in;
  at::Tensor residual;  // the first layer starts it
  for (int64_t l = 0; l < layers; ++l) {
    const at::Tensor* w = packed.data() + kLinears * l;
    const int64_t* kind = kinds.data() + kLinears * l;
    const auto bias = [&](int64_t i) { return biases.get(kLinears * l + i); };
    if (!residual.defined()) {
      residual = hidden;
      hidden = at::rms_norm(hidden, {hidden.size(1)}, norms[kNorms * l], eps);
    } else {
      std::tie(hidden, residual) = add_and_norm(hidden, residual, norms[kNorms * l], eps, fused);
    }
    // Attention: qkv, rotary on q and k, K and V into the pool, attention, o.
    const at::Tensor qkv = radixlm::prepared_linear(hidden, w[0], bias(0), kind[0]);
    const at::Tensor qk = rotate(
        qkv.narrow(1, 0, q_size + kv_size).view({tokens, num_heads + num_kv_heads, head_dim}),
        cos, sin, fused);
    const at::Tensor q = qk.narrow(1, 0, num_heads), k = qk.narrow(1, num_heads, num_kv_heads);
    const at::Tensor v =
        qkv.narrow(1, q_size + kv_size, kv_size).view({tokens, num_kv_heads, head_dim});
    at::Tensor k_buf = k_bufs[l], v_buf = v_bufs[l];
    kv_store(k_buf, v_buf, out_cache_loc, k, v);  // quantized where the pool is
    at::Tensor attn;
    {
      RECORD_FUNCTION("radixlm::paged_attention", std::vector<c10::IValue>());
      attn = paged_attention(q, k_buf, v_buf, req_to_token, req_rows, seq_lens, q_starts, q_lens,
                             scale);
    }
    hidden = radixlm::prepared_linear(attn.view({tokens, -1}), w[1], bias(1), kind[1]);
    std::tie(hidden, residual) = add_and_norm(hidden, residual, norms[kNorms * l + 1], eps, fused);
    // MLP.
    const at::Tensor gate_up = radixlm::prepared_linear(hidden, w[2], bias(2), kind[2]);
    hidden = radixlm::prepared_linear(silu_mul(gate_up, fused), w[3], bias(3), kind[3]);
  }
  return {hidden, residual};
}

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def(
      "llama_layer_stack(Tensor hidden, Tensor cos, Tensor sin, "
      "Tensor[] norms, Tensor[] packed, Tensor?[] biases, int[] kinds, Tensor(a!)[] k_bufs, "
      "Tensor(b!)[] v_bufs, Tensor out_cache_loc, Tensor req_to_token, Tensor req_rows, "
      "Tensor seq_lens, Tensor q_starts, Tensor q_lens, int num_heads, int num_kv_heads, "
      "int head_dim, float eps, float scale, bool fused) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("llama_layer_stack", &llama_layer_stack); }
// oneDNN-packed weights are tensors of the MkldnnCPU backend, which then picks the kernel.
TORCH_LIBRARY_IMPL(radixlm, MkldnnCPU, m) { m.impl("llama_layer_stack", &llama_layer_stack); }
