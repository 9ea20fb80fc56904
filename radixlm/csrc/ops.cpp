// torch.ops.radixlm.*: the kernels as real operators, so the profiler and
// torch.compile see them (ops.h lists where each lives). isa.cpp,
// prepared_linear.cpp, layer_program.cpp and moe.cpp register their own operators as
// fragments of this library.
#include <torch/library.h>

#include "ops.h"

TORCH_LIBRARY(radixlm, m) {
  m.def(
      "paged_attention(Tensor q, Tensor k_buf, Tensor v_buf, Tensor req_to_token, "
      "Tensor req_rows, Tensor seq_lens, Tensor q_starts, Tensor q_lens, float scale, "
      "int window=0) -> Tensor");
  m.def("kv_store(Tensor(a!) k_buf, Tensor(b!) v_buf, Tensor loc, Tensor k, Tensor v) -> ()");
  m.def("quantize_per_token(Tensor x) -> (Tensor, Tensor)");
  m.def("int8_linear(Tensor x, Tensor w_t, Tensor w_scales, Tensor? bias) -> Tensor");
  m.def("silu_and_mul(Tensor x) -> Tensor");
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("rotary_embedding(Tensor x, Tensor cos, Tensor sin) -> Tensor");
  m.def("small_batch_linear(Tensor x, Tensor w, Tensor? bias) -> Tensor");
  m.def("bf16_pairs_supported() -> bool", &bf16_pairs_supported);
  m.def("pack_bf16_pairs(Tensor w) -> Tensor");
  m.def("bf16_pairs_linear(Tensor x, Tensor packed, Tensor? bias) -> Tensor");
  m.def("bf16w_supported() -> bool", &bf16w_supported);
  m.def("bf16w_linear(Tensor x, Tensor packed, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) {
  m.impl("paged_attention",
         static_cast<at::Tensor (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                    const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                    const at::Tensor&, const at::Tensor&, double, int64_t)>(
             &paged_attention));
  m.impl("kv_store", &kv_store);
  m.impl("quantize_per_token", &quantize_per_token_op);
  m.impl("int8_linear", &int8_linear);
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("rotary_embedding", &rotary_embedding);
  m.impl("small_batch_linear", &small_batch_linear);
  m.impl("pack_bf16_pairs", &pack_bf16_pairs);
  m.impl("bf16_pairs_linear", &bf16_pairs_linear);
  m.impl("bf16w_linear", &bf16w_linear);
}
