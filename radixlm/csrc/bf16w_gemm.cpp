// float32 linear layers over bfloat16 weights, for CPUs without bf16 arithmetic
// (AVX2 or AVX-512F without AVX512_BF16): the weight is read at half of float32's
// bytes and widened to float32 in registers, the products and sums are float32.
//
// A decode step of a few rows is bound by the weight's bytes (one stream: every
// weight once per token), so half the bytes is up to half the time; from a few
// dozen rows on it is bound by the FMAs, where the widening (two integer ops per
// 16 weight pairs, shared by all rows of a tile) costs a few percent.
//
// The weight is packed as for the bf16 kernel (bf16_gemm.cpp: pack_bf16_pairs):
// groups of 16 output columns, each [K / 2][16][2], so one 64-byte load holds a k
// pair of 16 columns as 32-bit words (w[n][k + 1] << 16 | w[n][k]). The word
// shifted left by 16 is w[n][k] as a float, the word with its low half cleared is
// w[n][k + 1]. A tile of rows x groups keeps its accumulators in registers over
// all of K; each row is summed in the same order whatever the batch around it.
// The tiles are bf16w_gemm_body.h's, in the copy for the CPU's ISA level.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>

#include "isa.h"
#include "pairs_tiles.h"

#include <algorithm>
#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define RADIXLM_ISA_BODY "bf16w_gemm_body.h"
#include "isa_instantiate.h"
#undef RADIXLM_ISA_BODY

// Whether bf16w_linear runs at the kernels' ISA level now (any but a native build
// for a CPU without AVX2 and FMA).
bool bf16w_supported() { return RADIXLM_ISA_FN(bf16w_here)(); }

// x [M, K] float32 (rows may be strided), packed from pack_bf16_pairs, bias [N]
// float32 or None -> x w^T + bias [M, N] float32.
at::Tensor bf16w_linear(const at::Tensor& x, const at::Tensor& packed,
                        const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(bf16w_supported(), "bf16w_linear needs a CPU with AVX2 and FMA");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.stride(1) == 1,
              "bf16w_linear: x [M, K] float32 with contiguous rows");
  TORCH_CHECK(packed.dim() == 3 && packed.is_contiguous() && packed.size(1) * 2 == x.size(1) &&
                  packed.scalar_type() == at::kBFloat16,
              "bf16w_linear: packed weight does not match x");
  const int64_t m = x.size(0), pairs = packed.size(1), groups = packed.size(0);
  const int64_t n = groups * 16;
  const float* b = nullptr;
  at::Tensor bias_c;
  if (bias.has_value() && bias->defined()) {
    bias_c = bias->contiguous();
    TORCH_CHECK(bias_c.scalar_type() == at::kFloat && bias_c.numel() == n, "bias [N] float32");
    b = bias_c.data_ptr<float>();
  }
  auto out = at::empty({m, n}, x.options());
  const auto* wp = reinterpret_cast<const uint32_t*>(packed.data_ptr<c10::BFloat16>());
  RADIXLM_ISA_FN(bf16w_run)(x.data_ptr<float>(), x.stride(0), m, wp, groups, pairs, b,
                            out.data_ptr<float>());
  return out;
}
