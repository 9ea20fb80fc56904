// paged_attention: the torch-facing glue (argument checks, the output) around
// attention_body.h, whose copy for the CPU's ISA level does the work.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "claim_parallel.h"
#include "isa.h"
#include "kv_format.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace radixlm {

// One call's work as raw pointers (q, out: [T, H, D] in q_dtype, rows q_row_stride
// apart in q, contiguous in out; k_buf, v_buf: [slots, Hkv, row_width] in kv_dtype,
// a row as kv_format.h describes it; the index arrays as paged_attention below
// describes them; window: a query at position p sees keys p - window < j <= p, 0:
// all keys up to p).
struct PagedAttentionArgs {
  const void* q;
  void* out;
  const void* k_buf;
  const void* v_buf;
  c10::ScalarType q_dtype, kv_dtype;
  int64_t q_row_stride, num_heads, num_kv_heads, head_dim, row_width;
  const int64_t* req_to_token;
  int64_t table_stride;
  const int64_t* req_rows;
  const int64_t* seq_lens;
  const int64_t* q_starts;
  const int64_t* q_lens;
  int64_t batch;
  float scale;
  int64_t window;
};

}  // namespace radixlm

#define RADIXLM_ISA_BODY "attention_body.h"
#include "isa_instantiate.h"
#undef RADIXLM_ISA_BODY

namespace {

bool float_like(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

bool kv_storable(at::ScalarType t) {
  return float_like(t) || radixlm::kv_format_of(t) != radixlm::KvFormat::kPlain;
}

}  // namespace

// q [T, H, D]; k_buf, v_buf [slots, Hkv, row] (the pool as stored: kv_format.h);
// req_to_token [R, C] int64; req_rows, seq_lens, q_starts, q_lens [B] int64 (CPU).
// Request b owns query rows q_starts[b] .. + q_lens[b], at positions seq_lens[b] -
// q_lens[b] .. seq_lens[b] - 1; its keys are slots req_to_token[req_rows[b],
// :seq_lens[b]], of which a query at position p sees those at p - window < j <= p
// (window 0: j <= p). Keys no query of a request sees are not read. Rows of q not
// covered by any request are left as they are in `out`.
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                           const at::Tensor& req_to_token, const at::Tensor& req_rows,
                           const at::Tensor& seq_lens, const at::Tensor& q_starts,
                           const at::Tensor& q_lens, double scale, int64_t window) {
  TORCH_CHECK(q.device().is_cpu() && k_buf.device().is_cpu(), "paged_attention runs on the CPU");
  TORCH_CHECK(q.dim() == 3 && k_buf.dim() == 3 && v_buf.sizes() == k_buf.sizes());
  TORCH_CHECK(q.size(1) % k_buf.size(1) == 0, "paged_attention: query heads ", q.size(1),
              " are not a multiple of KV heads ", k_buf.size(1));
  TORCH_CHECK(window >= 0, "paged_attention: a negative window");
  TORCH_CHECK(k_buf.is_contiguous() && v_buf.is_contiguous() && req_to_token.stride(1) == 1);
  for (const auto* t : {&req_to_token, &req_rows, &seq_lens, &q_starts, &q_lens}) {
    TORCH_CHECK(t->scalar_type() == at::kLong, "paged_attention: index tensors must be int64");
  }
  TORCH_CHECK(float_like(q.scalar_type()), "paged_attention: unsupported query dtype ",
              q.scalar_type());
  TORCH_CHECK(kv_storable(k_buf.scalar_type()) && v_buf.scalar_type() == k_buf.scalar_type(),
              "paged_attention: unsupported KV dtype ", k_buf.scalar_type(), " / ",
              v_buf.scalar_type());
  const int64_t row_width =
      radixlm::kv_row_width(radixlm::kv_format_of(k_buf.scalar_type()), q.size(2));
  TORCH_CHECK(k_buf.size(2) == row_width, "paged_attention: a KV row of ", k_buf.size(2),
              " ", k_buf.scalar_type(), " elements does not hold head dim ", q.size(2));
  TORCH_CHECK(q.size(2) <= radixlm::kMaxHeadDim, "paged_attention: head dim over ",
              radixlm::kMaxHeadDim);
  // Rows may be strided (q is a view of the fused qkv projection); heads and dims may not.
  auto qc = (q.stride(2) == 1 && q.stride(1) == q.size(2)) ? q : q.contiguous();
  auto rows = req_rows.contiguous(), lens = seq_lens.contiguous();
  auto starts = q_starts.contiguous(), qlens = q_lens.contiguous();
  auto out = at::empty(qc.sizes(), qc.options());
  radixlm::PagedAttentionArgs args{qc.const_data_ptr(),
                                   out.data_ptr(),
                                   k_buf.const_data_ptr(),
                                   v_buf.const_data_ptr(),
                                   qc.scalar_type(),
                                   k_buf.scalar_type(),
                                   qc.stride(0),
                                   qc.size(1),
                                   k_buf.size(1),
                                   qc.size(2),
                                   row_width,
                                   req_to_token.const_data_ptr<int64_t>(),
                                   req_to_token.stride(0),
                                   rows.const_data_ptr<int64_t>(),
                                   lens.const_data_ptr<int64_t>(),
                                   starts.const_data_ptr<int64_t>(),
                                   qlens.const_data_ptr<int64_t>(),
                                   rows.size(0),
                                   static_cast<float>(scale),
                                   window};
  RADIXLM_ISA_FN(paged_attention_kernel)(args);
  return out;
}

// Without a window (the C++ layer stack's call).
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                           const at::Tensor& req_to_token, const at::Tensor& req_rows,
                           const at::Tensor& seq_lens, const at::Tensor& q_starts,
                           const at::Tensor& q_lens, double scale) {
  return paged_attention(q, k_buf, v_buf, req_to_token, req_rows, seq_lens, q_starts, q_lens,
                         scale, 0);
}
