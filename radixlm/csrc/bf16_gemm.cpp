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
// split the column tiles and each runs over the rows (pairs_tiles.h).
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include "pairs_tiles.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#ifdef __AVX512BF16__
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kGroup = 16;    // output columns per packed group (one vector of floats)
constexpr int64_t kTileGroups = 3;  // groups per tile: 48 columns
constexpr int64_t kRowsMax = 8;   // rows per tile: 8 x 3 = 24 accumulators

#ifdef __AVX512BF16__
inline __m512bh as_bh(__m512i v) { return reinterpret_cast<__m512bh&>(v); }

// out[m][c] = x[m] . w[c] (+ bias[c]) for kRows rows and kGroups groups of columns.
// next (or null): the next tile's weight, fetched into L2 meanwhile, one line per k
// pair and group, so that streaming it from memory overlaps this tile's products.
template <int64_t kRows, int64_t kGroups>
inline void tile(const c10::BFloat16* x, int64_t x_stride, const uint32_t* w, int64_t group_stride,
                 int64_t pairs, const c10::BFloat16* bias, c10::BFloat16* out, int64_t out_stride,
                 const uint32_t* next) {
  __m512 acc[kRows][kGroups];
  for (int64_t m = 0; m < kRows; ++m) {
    for (int64_t g = 0; g < kGroups; ++g) acc[m][g] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < pairs; ++p) {
    if (next != nullptr) {
      for (int64_t g = 0; g < kTileGroups; ++g) {
        __builtin_prefetch(next + g * group_stride + p * kGroup, 0, 2);
      }
    }
    __m512bh wv[kGroups];
    for (int64_t g = 0; g < kGroups; ++g) {
      wv[g] = as_bh(_mm512_loadu_si512(w + g * group_stride + p * kGroup));
    }
    for (int64_t m = 0; m < kRows; ++m) {
      uint32_t pair;
      std::memcpy(&pair, x + m * x_stride + 2 * p, sizeof(pair));
      const __m512bh xv = as_bh(_mm512_set1_epi32(static_cast<int>(pair)));
      for (int64_t g = 0; g < kGroups; ++g) acc[m][g] = _mm512_dpbf16_ps(acc[m][g], xv, wv[g]);
    }
  }
  for (int64_t g = 0; g < kGroups; ++g) {
    __m512 b = _mm512_setzero_ps();
    if (bias != nullptr) {  // bf16 -> float: the bits in the high half of each lane
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias + g * kGroup));
      b = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    }
    for (int64_t m = 0; m < kRows; ++m) {
      const __m256bh v = _mm512_cvtneps_pbh(_mm512_add_ps(acc[m][g], b));
      std::memcpy(out + m * out_stride + g * kGroup, &v, sizeof(v));
    }
  }
}

#endif

}  // namespace

// w [N, K] bfloat16, N a multiple of 16, K even -> [N / 16, K / 2, 32] bfloat16
// (see the top of the file).
at::Tensor pack_bf16_pairs(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kBFloat16, "pack_bf16_pairs: [N, K] bf16");
  const int64_t n = w.size(0), k = w.size(1);
  TORCH_CHECK(n % kGroup == 0 && k % 2 == 0, "pack_bf16_pairs: N % 16 and K % 2 must be 0");
  // [N/16, 16, K/2, 2] -> [N/16, K/2, 16, 2]
  return w.contiguous().view({n / kGroup, kGroup, k / 2, 2}).permute({0, 2, 1, 3})
      .contiguous().view({n / kGroup, k / 2, 2 * kGroup});
}

// x [M, K] bfloat16 (rows may be strided), packed from pack_bf16_pairs, bias [N]
// bfloat16 or None -> x w^T + bias [M, N] bfloat16.
at::Tensor bf16_pairs_linear(const at::Tensor& x, const at::Tensor& packed,
                             const c10::optional<at::Tensor>& bias) {
#ifdef __AVX512BF16__
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.stride(1) == 1,
              "bf16_pairs_linear: x [M, K] bf16 with contiguous rows");
  TORCH_CHECK(packed.dim() == 3 && packed.is_contiguous() && packed.size(1) * 2 == x.size(1),
              "bf16_pairs_linear: packed weight does not match x");
  const int64_t m = x.size(0), pairs = packed.size(1), groups = packed.size(0);
  const int64_t n = groups * kGroup;
  const c10::BFloat16* b = nullptr;
  at::Tensor bias_c;
  if (bias.has_value() && bias->defined()) {
    bias_c = bias->contiguous();
    TORCH_CHECK(bias_c.scalar_type() == at::kBFloat16 && bias_c.numel() == n, "bias [N] bf16");
    b = bias_c.data_ptr<c10::BFloat16>();
  }
  auto out = at::empty({m, n}, x.options());
  const auto* xp = x.data_ptr<c10::BFloat16>();
  const auto* wp = reinterpret_cast<const uint32_t*>(packed.data_ptr<c10::BFloat16>());
  auto* op = out.data_ptr<c10::BFloat16>();
  radixlm::for_each_tile<kTileGroups, kRowsMax>(
      xp, x.stride(0), m, wp, groups, pairs, b, op, [](auto rows, auto tile_groups, auto... args) {
        tile<decltype(rows)::value, decltype(tile_groups)::value>(args...);
      });
  return out;
#else
  (void)x, (void)packed, (void)bias;
  TORCH_CHECK(false, "bf16_pairs_linear needs a CPU with AVX512_BF16");
#endif
}

// Whether this build has bf16_pairs_linear (the CPU it was built for has AVX512_BF16).
bool bf16_pairs_supported() {
#ifdef __AVX512BF16__
  return true;
#else
  return false;
#endif
}

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("bf16_pairs_supported() -> bool", &bf16_pairs_supported);
  m.def("pack_bf16_pairs(Tensor w) -> Tensor");
  m.def("bf16_pairs_linear(Tensor x, Tensor packed, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) {
  m.impl("pack_bf16_pairs", &pack_bf16_pairs);
  m.impl("bf16_pairs_linear", &bf16_pairs_linear);
}
