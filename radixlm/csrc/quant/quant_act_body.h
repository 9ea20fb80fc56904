// ISA body (isa_instantiate.h) of the activation quantizer, included by
// quant_linear.cpp once per level after quant_gemm.h and <immintrin.h>.
//
// As llama.cpp quantizes a matmul's input: Q8_0 (blocks of 32: d = amax / 127 kept
// in fp16, q = round(x / d); Q8_1's sum s = d * sum(q) in fp16 for the offsets of
// Q4_1 / Q5_1) for the legacy weight formats, Q8_K (blocks of 256:
// iscale = -128 / x_max, the input of largest magnitude with its sign, q =
// min(127, round(x * iscale)), d = 1 / iscale) for the K-quants. Rounding is to
// nearest even, as llama.cpp's nearest_int and its AVX code do.

using namespace ::radixlm::quant;  // (the body sits in radixlm::isa_<level>)

// 8 floats of a float32 or bfloat16 row.
inline __m256 load8(const void* x, bool bf16, int64_t i) {
  if (bf16) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(x) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
  }
  return _mm256_loadu_ps(static_cast<const float*>(x) + i);
}

inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// q[0..n) = round(x * scale), saturated to [-128, 127].
inline void scale_round(const void* x, bool bf16, int64_t i0, int64_t n, float scale, int8_t* q) {
  const __m256 s = _mm256_set1_ps(scale);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(load8(x, bf16, i0 + i), s));
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i b = _mm_packs_epi16(w, w);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q + i), b);
  }
}

inline float block_amax(const void* x, bool bf16, int64_t i0, int64_t n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, load8(x, bf16, i0 + i)));
  return hmax8(m);
}

inline float value_at(const void* x, bool bf16, int64_t i) {
  if (!bf16) return static_cast<const float*>(x)[i];
  const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(x)[i]) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// One row: x[0..k) -> q[0..k), d[k / block], integer and scaled sums of 16 and 32.
inline void quantize_row(const void* x, bool bf16, int64_t k, int64_t block, int8_t* q, float* d,
                         int32_t* bs16, int32_t* bs32, float* bsf16, float* bsf32) {
  for (int64_t b = 0; b < k / block; ++b) {
    const int64_t i0 = b * block;
    const float amax = block_amax(x, bf16, i0, block);
    float scale = 0.0f, dq = 0.0f, d_exact = 0.0f;
    if (block == 32) {  // Q8_0 (as llama.cpp's AVX quantize_row_q8_0: id = 127 / amax)
      scale = amax != 0.0f ? 127.0f / amax : 0.0f;
      d_exact = amax / 127.0f;
      dq = half_to_float(float_to_half(d_exact));
    } else if (amax != 0.0f) {  // Q8_K: the first input of largest magnitude, with its sign
      float xmax = 0.0f;
      for (int64_t i = 0; i < block; ++i) {
        const float v = value_at(x, bf16, i0 + i);
        if (std::fabs(v) == amax) {
          xmax = v;
          break;
        }
      }
      scale = -128.0f / xmax;
      dq = 1.0f / scale;
    }
    if (scale == 0.0f) {
      std::memset(q + i0, 0, block);
    } else {
      // (Q8_K: an input of -x_max gives +128, which the packing saturates to 127:
      // llama.cpp's MIN(127, v))
      scale_round(x, bf16, i0, block, scale, q + i0);
    }
    d[b] = dq;
    for (int64_t s = 0; s < block / 16; ++s) {
      int32_t sum = 0;
      for (int64_t i = 0; i < 16; ++i) sum += q[i0 + 16 * s + i];
      bs16[i0 / 16 + s] = sum;
      bsf16[i0 / 16 + s] = dq * static_cast<float>(sum);
    }
    for (int64_t s = 0; s < block / 32; ++s) {
      const int32_t sum = bs16[i0 / 16 + 2 * s] + bs16[i0 / 16 + 2 * s + 1];
      bs32[i0 / 32 + s] = sum;
      // Q8_1's s for Q4_1 / Q5_1 weights: the unrounded d times the sum, kept in fp16
      bsf32[i0 / 32 + s] = block == 32 ? half_to_float(float_to_half(d_exact * static_cast<float>(sum)))
                                       : dq * static_cast<float>(sum);
    }
  }
}
