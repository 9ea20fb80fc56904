// bf16 linear layers of a few to a few dozen rows (a decode batch) on CPUs with
// AVX512_BF16, faster there than oneDNN's packed bf16 GEMM (which reaches its
// rate only from ~64 rows on).
//
// The weight [N, K] is packed once into groups of 16 output columns, each
// [K / 2][16][2]: the pair (w[n][k], w[n][k + 1]) of each column side by side, so
// one 64-byte load holds a k pair of 16 columns, as vdpbf16ps wants it (two bf16
// products summed into each float lane). A tile of kRowsMax rows x 3 groups (48
// columns) keeps its 24 accumulators in registers over all of K: per k pair, 3
// weight loads, one broadcast of each row's x pair, 24 dot products. Threads
// split the column tiles and each runs over the rows (pairs_tiles.h). The tiles
// are bf16_gemm_body.h's, compiled at the avx512bf16 level only.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>

#include "isa.h"
#include "pairs_tiles.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define RADIXLM_ISA_BODY "bf16_gemm_body.h"
#include "isa_instantiate.h"
#undef RADIXLM_ISA_BODY

namespace {

constexpr int64_t kPackGroup = 16;  // output columns per packed group

}  // namespace

// w [N, K] bfloat16, N a multiple of 16, K even -> [N / 16, K / 2, 32] bfloat16
// (see the top of the file).
at::Tensor pack_bf16_pairs(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kBFloat16, "pack_bf16_pairs: [N, K] bf16");
  const int64_t n = w.size(0), k = w.size(1);
  TORCH_CHECK(n % kPackGroup == 0 && k % 2 == 0, "pack_bf16_pairs: N % 16 and K % 2 must be 0");
  // [N/16, 16, K/2, 2] -> [N/16, K/2, 16, 2]
  return w.contiguous()
      .view({n / kPackGroup, kPackGroup, k / 2, 2})
      .permute({0, 2, 1, 3})
      .contiguous()
      .view({n / kPackGroup, k / 2, 2 * kPackGroup});
}

// Whether bf16_pairs_linear runs at the kernels' ISA level now (avx512bf16: the CPU
// has AVX512_BF16 and no lower level was asked for).
bool bf16_pairs_supported() { return RADIXLM_ISA_FN(bf16_pairs_here)(); }

// x [M, K] bfloat16 (rows may be strided), packed from pack_bf16_pairs, bias [N]
// bfloat16 or None -> x w^T + bias [M, N] bfloat16.
at::Tensor bf16_pairs_linear(const at::Tensor& x, const at::Tensor& packed,
                             const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(bf16_pairs_supported(), "bf16_pairs_linear needs AVX512_BF16 (kernels at ",
              radixlm::isa_name(radixlm::active_isa()), ")");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.stride(1) == 1,
              "bf16_pairs_linear: x [M, K] bf16 with contiguous rows");
  TORCH_CHECK(packed.dim() == 3 && packed.is_contiguous() && packed.size(1) * 2 == x.size(1),
              "bf16_pairs_linear: packed weight does not match x");
  const int64_t m = x.size(0), pairs = packed.size(1), groups = packed.size(0);
  const int64_t n = groups * kPackGroup;
  const c10::BFloat16* b = nullptr;
  at::Tensor bias_c;
  if (bias.has_value() && bias->defined()) {
    bias_c = bias->contiguous();
    TORCH_CHECK(bias_c.scalar_type() == at::kBFloat16 && bias_c.numel() == n, "bias [N] bf16");
    b = bias_c.data_ptr<c10::BFloat16>();
  }
  auto out = at::empty({m, n}, x.options());
  const auto* wp = reinterpret_cast<const uint32_t*>(packed.data_ptr<c10::BFloat16>());
  RADIXLM_ISA_FN(bf16_pairs_run)(x.data_ptr<c10::BFloat16>(), x.stride(0), m, wp, groups, pairs,
                                 b, out.data_ptr<c10::BFloat16>());
  return out;
}
