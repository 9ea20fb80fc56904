// bf16_pairs_linear's tiles, one level's copy (an ISA body, see isa.h;
// bf16_gemm.cpp instantiates it): only the avx512bf16 level has them (vdpbf16ps);
// below it bf16_pairs_here() is false and the glue refuses the call.
namespace {

constexpr int64_t kGroup = 16;      // output columns per packed group (one vector of floats)
constexpr int64_t kTileGroups = 3;  // groups per tile: 48 columns
constexpr int64_t kRowsMax = 8;     // rows per tile: 8 x 3 = 24 accumulators

#if RADIXLM_ISA_AVX512BF16
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

// out [m, groups * 16] <- x [m, 2 pairs] w^T + bias (pairs_tiles.h's tile loop).
void bf16_pairs_run(const c10::BFloat16* x, int64_t x_stride, int64_t m, const uint32_t* w,
                    int64_t groups, int64_t pairs, const c10::BFloat16* bias,
                    c10::BFloat16* out) {
  radixlm::for_each_tile<kTileGroups, kRowsMax>(
      x, x_stride, m, w, groups, pairs, bias, out, [](auto rows, auto tile_groups, auto... args) {
        tile<decltype(rows)::value, decltype(tile_groups)::value>(args...);
      });
}

bool bf16_pairs_here() { return true; }
#else
void bf16_pairs_run(const c10::BFloat16*, int64_t, int64_t, const uint32_t*, int64_t, int64_t,
                    const c10::BFloat16*, c10::BFloat16*) {}  // never called (the glue checks)

bool bf16_pairs_here() { return false; }
#endif

}  // namespace
