// The decoder layers of a Llama-family model in one call, for bf16 steps on CPUs
// with AVX512_BF16 (every linear layer through bf16_pairs_linear, attention
// through paged_attention).
//
// The Python loop over layers spends ~150 us a layer outside the kernels (module
// calls, argument checks, ~15 operator calls from Python): with 30 layers ~5 ms
// of a 20 ms one-request decode step. Here the same kernels run in the same
// order on the same arguments, called from C++, so the result is bit for bit the
// Python loop's (tests/models/test_layer_stack.py) at a fraction of the
// overhead. models/layer_stack.py decides when a step may take this path.
#include <torch/extension.h>

#include <tuple>
#include <vector>

// The kernels (cpu_kernels.cpp, bf16_gemm.cpp).
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                           const at::Tensor& req_to_token, const at::Tensor& req_rows,
                           const at::Tensor& seq_lens, const at::Tensor& q_starts,
                           const at::Tensor& q_lens, double scale);
at::Tensor silu_and_mul(const at::Tensor& x);
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps);
at::Tensor rotary_embedding(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor bf16_pairs_linear(const at::Tensor& x, const at::Tensor& packed,
                             const c10::optional<at::Tensor>& bias);

namespace {

constexpr int64_t kNorms = 2;    // per layer: input_layernorm, post_attention_layernorm
constexpr int64_t kLinears = 4;  // per layer: qkv, o, gate_up, down

}  // namespace

// hidden [T, hidden] bf16 (the embeddings), residual: undefined before the first
// layer; cos, sin [T, 1, D / 2] bf16; per layer l: norms[2l .. 2l + 2), packed and
// biases [4l .. 4l + 4) (see the constants above), k_bufs[l], v_bufs[l]; the
// attention arguments of paged_attention for every row of the step. Writes each
// layer's K and V at out_cache_loc and returns (hidden, residual) after the last
// layer, which the final norm adds: what LlamaModel's loop returns.
std::tuple<at::Tensor, at::Tensor> llama_layer_stack(
    const at::Tensor& hidden_in, const c10::optional<at::Tensor>& residual_in,
    const at::Tensor& cos, const at::Tensor& sin, at::TensorList norms, at::TensorList packed,
    const c10::List<c10::optional<at::Tensor>>& biases, at::TensorList k_bufs,
    at::TensorList v_bufs, const at::Tensor& out_cache_loc, const at::Tensor& req_to_token,
    const at::Tensor& req_rows, const at::Tensor& seq_lens, const at::Tensor& q_starts,
    const at::Tensor& q_lens, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
    double eps, double scale) {
  const int64_t layers = static_cast<int64_t>(k_bufs.size());
  TORCH_CHECK(static_cast<int64_t>(v_bufs.size()) == layers &&
                  static_cast<int64_t>(norms.size()) == kNorms * layers &&
                  static_cast<int64_t>(packed.size()) == kLinears * layers &&
                  static_cast<int64_t>(biases.size()) == kLinears * layers,
              "llama_layer_stack: 2 norms, 4 linear layers and a K and V buffer per layer");
  TORCH_CHECK(hidden_in.dim() == 2 && hidden_in.scalar_type() == at::kBFloat16,
              "llama_layer_stack: hidden [T, hidden] bf16");
  const int64_t tokens = hidden_in.size(0);
  const int64_t q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
  const auto bias = [&](int64_t i) -> c10::optional<at::Tensor> { return biases.get(i); };
  at::Tensor hidden = hidden_in;
  at::Tensor residual = residual_in.has_value() ? *residual_in : at::Tensor();
  for (int64_t l = 0; l < layers; ++l) {
    const at::Tensor* w = packed.data() + kLinears * l;
    if (!residual.defined()) {
      residual = hidden;
      hidden = at::rms_norm(hidden, {hidden.size(1)}, norms[kNorms * l], eps);
    } else {
      std::tie(hidden, residual) = add_rms_norm(hidden, residual.contiguous(), norms[kNorms * l], eps);
    }
    // Attention: qkv, rotary on q and k, K and V into the pool, attention, o.
    const at::Tensor qkv = bf16_pairs_linear(hidden, w[0], bias(kLinears * l));
    const at::Tensor qk = rotary_embedding(
        qkv.narrow(1, 0, q_size + kv_size).view({tokens, num_heads + num_kv_heads, head_dim}),
        cos, sin);
    const at::Tensor q = qk.narrow(1, 0, num_heads), k = qk.narrow(1, num_heads, num_kv_heads);
    const at::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({tokens, num_kv_heads, head_dim});
    at::Tensor k_buf = k_bufs[l], v_buf = v_bufs[l];
    k_buf.index_copy_(0, out_cache_loc, k);
    v_buf.index_copy_(0, out_cache_loc, v);
    const at::Tensor attn = paged_attention(q, k_buf, v_buf, req_to_token, req_rows, seq_lens,
                                            q_starts, q_lens, scale);
    hidden = bf16_pairs_linear(attn.view({tokens, -1}), w[1], bias(kLinears * l + 1));
    std::tie(hidden, residual) = add_rms_norm(hidden, residual, norms[kNorms * l + 1], eps);
    // MLP.
    const at::Tensor gate_up = bf16_pairs_linear(hidden, w[2], bias(kLinears * l + 2));
    hidden = bf16_pairs_linear(silu_and_mul(gate_up), w[3], bias(kLinears * l + 3));
  }
  return {hidden, residual};
}

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def(
      "llama_layer_stack(Tensor hidden, Tensor? residual, Tensor cos, Tensor sin, "
      "Tensor[] norms, Tensor[] packed, Tensor?[] biases, Tensor(a!)[] k_bufs, "
      "Tensor(b!)[] v_bufs, Tensor out_cache_loc, Tensor req_to_token, Tensor req_rows, "
      "Tensor seq_lens, Tensor q_starts, Tensor q_lens, int num_heads, int num_kv_heads, "
      "int head_dim, float eps, float scale) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("llama_layer_stack", &llama_layer_stack); }
