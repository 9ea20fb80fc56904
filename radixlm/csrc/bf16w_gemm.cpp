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
#include <torch/extension.h>

#include "pairs_tiles.h"

#include <algorithm>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RADIXLM_BF16W 1
#endif

namespace {

constexpr int64_t kGroup = 16;  // output columns per packed group

#ifdef RADIXLM_BF16W
#ifdef __AVX512F__
// One vector of floats holds a whole group.
struct Isa {
  using V = __m512;
  static constexpr int64_t kPerGroup = 1;     // vectors per group of 16 columns
  static constexpr int64_t kTileGroups = 3;   // groups per tile (48 columns)
  static constexpr int64_t kRowsMax = 8;      // 8 x 3 accumulators + 6 weight vectors
  static V zero() { return _mm512_setzero_ps(); }
  static void widen(const uint32_t* w, V* lo, V* hi) {  // 16 words -> w[k], w[k + 1]
    const __m512i v = _mm512_loadu_si512(w);
    *lo = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    *hi = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int32_t(0xffff0000u))));
  }
  static V bcast(const float* x) { return _mm512_set1_ps(*x); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
};
#else
// Two vectors of floats per group (AVX2, 16 registers).
struct Isa {
  using V = __m256;
  static constexpr int64_t kPerGroup = 2;
  static constexpr int64_t kTileGroups = 1;   // one group (16 columns)
  static constexpr int64_t kRowsMax = 5;      // 5 x 2 accumulators + 4 weight vectors + x
  static V zero() { return _mm256_setzero_ps(); }
  static void widen(const uint32_t* w, V* lo, V* hi) {  // 8 words -> w[k], w[k + 1]
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    *lo = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    *hi = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(int32_t(0xffff0000u))));
  }
  static V bcast(const float* x) { return _mm256_broadcast_ss(x); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
};
#endif

constexpr int64_t kLanes = kGroup / Isa::kPerGroup;  // floats per vector
static_assert(Isa::kTileGroups == 1 || Isa::kTileGroups == 3, "tiles of 1 or 3 groups");

// out[m][c] = x[m] . w[c] (+ bias[c]) for kRows rows and kGroups groups of columns;
// next (or null): the next tile's weight, fetched into L2 meanwhile.
template <int64_t kRows, int64_t kGroups>
inline void tile(const float* x, int64_t x_stride, const uint32_t* w, int64_t group_stride,
                 int64_t pairs, const float* bias, float* out, int64_t out_stride,
                 const uint32_t* next) {
  constexpr int64_t kVecs = kGroups * Isa::kPerGroup;
  Isa::V acc[kRows][kVecs];
  for (int64_t m = 0; m < kRows; ++m) {
    for (int64_t v = 0; v < kVecs; ++v) acc[m][v] = Isa::zero();
  }
  for (int64_t p = 0; p < pairs; ++p) {
    if (next != nullptr) {
      for (int64_t g = 0; g < kGroups; ++g) {
        __builtin_prefetch(next + g * group_stride + p * kGroup, 0, 2);
      }
    }
    Isa::V lo[kVecs], hi[kVecs];
    for (int64_t g = 0; g < kGroups; ++g) {
      for (int64_t h = 0; h < Isa::kPerGroup; ++h) {
        Isa::widen(w + g * group_stride + p * kGroup + h * kLanes, &lo[g * Isa::kPerGroup + h],
                   &hi[g * Isa::kPerGroup + h]);
      }
    }
    for (int64_t m = 0; m < kRows; ++m) {
      const Isa::V x0 = Isa::bcast(x + m * x_stride + 2 * p);
      const Isa::V x1 = Isa::bcast(x + m * x_stride + 2 * p + 1);
      for (int64_t v = 0; v < kVecs; ++v) {
        acc[m][v] = Isa::fma(x1, hi[v], Isa::fma(x0, lo[v], acc[m][v]));
      }
    }
  }
  for (int64_t v = 0; v < kVecs; ++v) {
    const Isa::V b = bias != nullptr ? Isa::load(bias + v * kLanes) : Isa::zero();
    for (int64_t m = 0; m < kRows; ++m) {
      Isa::store(out + m * out_stride + v * kLanes, Isa::add(acc[m][v], b));
    }
  }
}

#endif

}  // namespace

// x [M, K] float32 (rows may be strided), packed from pack_bf16_pairs, bias [N]
// float32 or None -> x w^T + bias [M, N] float32.
at::Tensor bf16w_linear(const at::Tensor& x, const at::Tensor& packed,
                        const c10::optional<at::Tensor>& bias) {
#ifdef RADIXLM_BF16W
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.stride(1) == 1,
              "bf16w_linear: x [M, K] float32 with contiguous rows");
  TORCH_CHECK(packed.dim() == 3 && packed.is_contiguous() && packed.size(1) * 2 == x.size(1) &&
                  packed.scalar_type() == at::kBFloat16,
              "bf16w_linear: packed weight does not match x");
  const int64_t m = x.size(0), pairs = packed.size(1), groups = packed.size(0);
  const int64_t n = groups * kGroup;
  const float* b = nullptr;
  at::Tensor bias_c;
  if (bias.has_value() && bias->defined()) {
    bias_c = bias->contiguous();
    TORCH_CHECK(bias_c.scalar_type() == at::kFloat && bias_c.numel() == n, "bias [N] float32");
    b = bias_c.data_ptr<float>();
  }
  auto out = at::empty({m, n}, x.options());
  const float* xp = x.data_ptr<float>();
  const auto* wp = reinterpret_cast<const uint32_t*>(packed.data_ptr<c10::BFloat16>());
  float* op = out.data_ptr<float>();
  radixlm::for_each_tile<Isa::kTileGroups, Isa::kRowsMax>(
      xp, x.stride(0), m, wp, groups, pairs, b, op, [](auto rows, auto tile_groups, auto... args) {
        tile<decltype(rows)::value, decltype(tile_groups)::value>(args...);
      });
  return out;
#else
  (void)x, (void)packed, (void)bias;
  TORCH_CHECK(false, "bf16w_linear needs a CPU with AVX2 and FMA");
#endif
}

// Whether this build has bf16w_linear (the CPU it was built for has AVX2 and FMA).
bool bf16w_supported() {
#ifdef RADIXLM_BF16W
  return true;
#else
  return false;
#endif
}

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("bf16w_supported() -> bool", &bf16w_supported);
  m.def("bf16w_linear(Tensor x, Tensor packed, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) {
  m.impl("bf16w_linear", &bf16w_linear);
}
