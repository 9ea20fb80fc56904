// bf16w_linear's tiles, one level's copy (an ISA body, see isa.h; bf16w_gemm.cpp
// instantiates it): one vector of 16 floats per column group at the AVX-512
// levels, two of 8 at avx2; none in a native build without AVX2 and FMA (then
// bf16w_here() is false and the glue refuses the call).
namespace {

constexpr int64_t kGroup = 16;  // output columns per packed group

#if RADIXLM_ISA_AVX512
// One vector of floats holds a whole group.
struct Simd {
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
#elif RADIXLM_ISA_AVX2
// Two vectors of floats per group (AVX2, 16 registers).
struct Simd {
  using V = __m256;
  static constexpr int64_t kPerGroup = 2;
  static constexpr int64_t kTileGroups = 1;   // one group (16 columns)
  static constexpr int64_t kRowsMax = 5;      // 5 x 2 accumulators + 4 weight vectors + x
  static V zero() { return _mm256_setzero_ps(); }
  // 8 words -> w[k], w[k + 1]. The low halves are cleared by a blend with zero, not an
  // and with a mask: a mask register was one too many for the 16 (the accumulators
  // spilled to the stack: 1.6x the time), zero is rematerialized for free.
  static void widen(const uint32_t* w, V* lo, V* hi) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    *lo = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    *hi = _mm256_castsi256_ps(_mm256_blend_epi16(v, _mm256_setzero_si256(), 0x55));
  }
  static V bcast(const float* x) { return _mm256_broadcast_ss(x); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
};
#endif

#if RADIXLM_ISA_AVX2
constexpr int64_t kLanes = kGroup / Simd::kPerGroup;  // floats per vector
static_assert(Simd::kTileGroups == 1 || Simd::kTileGroups == 3, "tiles of 1 or 3 groups");

// out[m][c] = x[m] . w[c] (+ bias[c]) for kRows rows and kGroups groups of columns;
// next (or null): the next tile's weight, fetched into L2 meanwhile. The loops over
// rows and vectors are unrolled before anything else looks at them (#pragma GCC
// unroll), so that the accumulators become registers: compiled on its own (not
// inlined into the tile loop as in a -march build), the AVX2 copy otherwise kept
// them in an array on the stack (1.6x the time).
template <int64_t kRows, int64_t kGroups>
inline void tile(const float* x, int64_t x_stride, const uint32_t* w, int64_t group_stride,
                 int64_t pairs, const float* bias, float* out, int64_t out_stride,
                 const uint32_t* next) {
  constexpr int64_t kVecs = kGroups * Simd::kPerGroup;
  Simd::V acc[kRows][kVecs];
  #pragma GCC unroll 16
  for (int64_t m = 0; m < kRows; ++m) {
    #pragma GCC unroll 16
    for (int64_t v = 0; v < kVecs; ++v) acc[m][v] = Simd::zero();
  }
  for (int64_t p = 0; p < pairs; ++p) {
    if (next != nullptr) {
      #pragma GCC unroll 16
      for (int64_t g = 0; g < kGroups; ++g) {
        __builtin_prefetch(next + g * group_stride + p * kGroup, 0, 2);
      }
    }
    Simd::V lo[kVecs], hi[kVecs];
    #pragma GCC unroll 16
    for (int64_t g = 0; g < kGroups; ++g) {
      #pragma GCC unroll 16
      for (int64_t h = 0; h < Simd::kPerGroup; ++h) {
        Simd::widen(w + g * group_stride + p * kGroup + h * kLanes,
                    &lo[g * Simd::kPerGroup + h], &hi[g * Simd::kPerGroup + h]);
      }
    }
    #pragma GCC unroll 16
    for (int64_t m = 0; m < kRows; ++m) {
      const Simd::V x0 = Simd::bcast(x + m * x_stride + 2 * p);
      const Simd::V x1 = Simd::bcast(x + m * x_stride + 2 * p + 1);
      #pragma GCC unroll 16
      for (int64_t v = 0; v < kVecs; ++v) {
        acc[m][v] = Simd::fma(x1, hi[v], Simd::fma(x0, lo[v], acc[m][v]));
      }
    }
  }
  #pragma GCC unroll 16
  for (int64_t v = 0; v < kVecs; ++v) {
    const Simd::V b = bias != nullptr ? Simd::load(bias + v * kLanes) : Simd::zero();
    #pragma GCC unroll 16
    for (int64_t m = 0; m < kRows; ++m) {
      Simd::store(out + m * out_stride + v * kLanes, Simd::add(acc[m][v], b));
    }
  }
}

// out [m, groups * 16] <- x [m, 2 pairs] w^T + bias (pairs_tiles.h's tile loop).
void bf16w_run(const float* x, int64_t x_stride, int64_t m, const uint32_t* w, int64_t groups,
               int64_t pairs, const float* bias, float* out) {
  radixlm::for_each_tile<Simd::kTileGroups, Simd::kRowsMax>(
      x, x_stride, m, w, groups, pairs, bias, out, [](auto rows, auto tile_groups, auto... args) {
        tile<decltype(rows)::value, decltype(tile_groups)::value>(args...);
      });
}

bool bf16w_here() { return true; }
#else
void bf16w_run(const float*, int64_t, int64_t, const uint32_t*, int64_t, int64_t, const float*,
               float*) {}  // never called (the glue checks)

bool bf16w_here() { return false; }
#endif

}  // namespace
