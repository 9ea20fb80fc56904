// q_linear: x W^T + b over a packed quantized weight (quant_layout.h). The input
// rows are quantized once per activation format the weight's segments need (Q8_0
// for legacy formats, Q8_K for K-quants), then each segment's kernel writes its
// columns of the output.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>

#include "../isa.h"
#include "quant_gemm.h"

#define RADIXLM_ISA_BODY "quant/quant_act_body.h"
#include "../isa_instantiate.h"
#undef RADIXLM_ISA_BODY

namespace radixlm::quant {

void quantize_rows(const void* x, bool x_bf16, int64_t ldx, int64_t m, int64_t k, int64_t block,
                   QuantizedRows& out, int8_t* q, float* d, int32_t* bs16, int32_t* bs32,
                   float* bsf16, float* bsf32) {
  out = {q, d, bs16, bs32, bsf16, bsf32, k, k / block, k / 16, k / 32};
  const auto row_fn = RADIXLM_ISA_FN(quantize_row);
  const int64_t elem = x_bf16 ? 2 : 4;
  at::parallel_for(0, m, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      row_fn(static_cast<const char*>(x) + r * ldx * elem, x_bf16, k, block, q + r * k,
             d + r * (k / block), bs16 + r * (k / 16), bs32 + r * (k / 32), bsf16 + r * (k / 16),
             bsf32 + r * (k / 32));
    }
  });
}

namespace {

// One quantized copy of the input rows and its tables.
struct RowsBuffer {
  at::Tensor q, d, bs16, bs32, bsf16, bsf32;
  QuantizedRows rows{};

  RowsBuffer(const at::Tensor& x, int64_t block) {
    const int64_t m = x.size(0), k = x.size(1);
    const auto f32 = x.options().dtype(at::kFloat), i32 = x.options().dtype(at::kInt);
    q = at::empty({m, k}, x.options().dtype(at::kChar));
    d = at::empty({m, k / block}, f32);
    bs16 = at::empty({m, k / 16}, i32);
    bs32 = at::empty({m, k / 32}, i32);
    bsf16 = at::empty({m, k / 16}, f32);
    bsf32 = at::empty({m, k / 32}, f32);
    quantize_rows(x.data_ptr(), x.scalar_type() == at::kBFloat16, x.stride(0), m, k, block, rows,
                  q.data_ptr<int8_t>(), d.data_ptr<float>(), bs16.data_ptr<int32_t>(),
                  bs32.data_ptr<int32_t>(), bsf16.data_ptr<float>(), bsf32.data_ptr<float>());
  }
};

}  // namespace

at::Tensor q_linear(const at::Tensor& x, const at::Tensor& blob,
                    const c10::optional<at::Tensor>& bias, bool out_float32) {
  TORCH_CHECK(x.dim() == 2 && (x.stride(1) == 1 || x.size(0) == 0) &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "q_linear: x [M, K] float32 or bfloat16 with contiguous rows");
  TORCH_CHECK(blob.scalar_type() == at::kByte && blob.dim() == 1 && blob.is_contiguous(),
              "q_linear: a packed quantized weight");
  const auto* base = blob.data_ptr<uint8_t>();
  const auto* header = reinterpret_cast<const BlobHeader*>(base);
  TORCH_CHECK(header->magic == kBlobMagic, "q_linear: not a packed quantized weight");
  const auto* segs = reinterpret_cast<const Segment*>(base + sizeof(BlobHeader));
  const int64_t m = x.size(0), k = header->k, n = header->n;
  TORCH_CHECK(x.size(1) == k, "q_linear: x has ", x.size(1), " features, the weight ", k);
  const bool bf16_out = !out_float32 && x.scalar_type() == at::kBFloat16;
  at::Tensor out = at::empty({m, n}, x.options().dtype(bf16_out ? at::kBFloat16 : at::kFloat));
  at::Tensor bias_f;
  if (bias.has_value() && bias->defined()) {
    bias_f = bias->to(at::kFloat).contiguous();
    TORCH_CHECK(bias_f.numel() == n, "q_linear: bias of ", bias_f.numel(), " for ", n, " outputs");
  }
  if (m == 0 || n == 0) return out;
  bool legacy = false, kq = false;
  for (int64_t s = 0; s < header->num_segments; ++s) {
    const Format* f = find_format(segs[s].type);
    TORCH_CHECK(f != nullptr, "q_linear: GGML type ", segs[s].type, " is not supported");
    (f->k_quant ? kq : legacy) = true;
  }
  const at::Tensor xc = x;
  std::optional<RowsBuffer> q32, q256;
  if (legacy) q32.emplace(xc, 32);
  if (kq) {
    TORCH_CHECK(k % 256 == 0, "q_linear: K-quants need K % 256 == 0");
    q256.emplace(xc, 256);
  }
  const int64_t elem = bf16_out ? 2 : 4;
  int64_t col0 = 0;
  for (int64_t s = 0; s < header->num_segments; ++s) {
    const Format& f = *find_format(segs[s].type);
    GemmArgs args{base + segs[s].offset, segs[s].n, k, segs[s].groups,
                  f.k_quant ? &q256->rows : &q32->rows, m,
                  static_cast<char*>(out.data_ptr()) + col0 * elem, n, bf16_out,
                  bias_f.defined() ? bias_f.data_ptr<float>() + col0 : nullptr};
    const bool ran = f.k_quant ? gemm_k(f.type, args) : gemm_legacy(f.type, args);
    TORCH_CHECK(ran, "q_linear: no kernel for GGML type ", f.type);
    col0 += segs[s].n;
  }
  return out;
}

}  // namespace radixlm::quant

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("q_linear(Tensor x, Tensor blob, Tensor? bias, bool out_float32=False) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("q_linear", &radixlm::quant::q_linear); }
