// How paged attention reads the pool's rows (an ISA body fragment, included by
// attention_body.h after vec_body.h): a KV head's rows in the pool, and each
// storage format (kv_format.h) converted to float in registers.
//
// A row converts to its float values (load_row, row_to_float), except that an
// int8 row stays in its blocks' rotated (Hadamard) basis: the kernels rotate each
// query row into it once (rotate_rows) and each output row back (the same call),
// since q . k = (H q) . (H k) and sum p v = H sum p (H v). An fp8_e4m3 value is its
// bits moved into a float16 (sign, then exponent and mantissa shifted by 7) times
// 2^8; fp8_e5m2 is the top byte of a float16.

// Storage types the kernel is instantiated for besides float, BFloat16 and Half:
// int8_t (int8 rows) and these two (fp8 bytes).
struct KvE4m3 {
  uint8_t bits;
};
struct KvE5m2 {
  uint8_t bits;
};

inline float half_bits_to_float(uint16_t h) {
  return static_cast<float>(c10::Half(h, c10::Half::from_bits()));
}
inline uint16_t e4m3_half_bits(uint8_t b) {
  return static_cast<uint16_t>(((b & 0x80) << 8) | ((b & 0x7F) << 7));
}
inline float to_float(KvE4m3 x) { return half_bits_to_float(e4m3_half_bits(x.bits)) * 256.0f; }
inline float to_float(KvE5m2 x) { return half_bits_to_float(static_cast<uint16_t>(x.bits << 8)); }

// Formats converted in registers (never read as they lie), and those in a rotated basis.
template <typename kvT>
constexpr bool kQuantized =
    std::is_same_v<kvT, int8_t> || std::is_same_v<kvT, KvE4m3> || std::is_same_v<kvT, KvE5m2>;
template <typename kvT>
constexpr bool kRotated = std::is_same_v<kvT, int8_t>;

// The float scales of an int8 row of head_dim values (one per block).
inline void int8_scales(const int8_t* row, int64_t head_dim, float* out) {
  const int64_t blocks = head_dim / radixlm::kv_int8_block(head_dim);
  for (int64_t b = 0; b < blocks; ++b) {
    uint16_t bits;
    std::memcpy(&bits, row + head_dim + 2 * b, sizeof(bits));
    out[b] = half_bits_to_float(bits);
  }
}

// rows x n floats, each rotated into (or, the same transform, out of) an int8 row's
// basis where kvT is int8; nothing otherwise.
template <typename kvT>
inline void rotate_rows(float* x, int64_t rows, int64_t n) {
  if constexpr (kRotated<kvT>) {
    for (int64_t r = 0; r < rows; ++r) {
      radixlm::hadamard_blocks(x + r * n, n, radixlm::kv_int8_block(n));
    }
  } else {
    (void)x, (void)rows, (void)n;
  }
}

// One KV head's rows in the pool: slot s's key at k + s * slot_stride.
template <typename kvT>
struct KvRows {
  const kvT* k;
  const kvT* v;
  int64_t slot_stride;  // storage elements from a slot to the next (Hkv rows)
  int64_t row_elems;    // storage elements of one row (prefetched whole)
  const kvT* key(int64_t slot) const { return k + slot * slot_stride; }
  const kvT* value(int64_t slot) const { return v + slot * slot_stride; }
};

// The first key a query at position `pos` sees under `window` (0: none).
inline int64_t first_key(int64_t pos, int64_t window) {
  return window > 0 ? std::max<int64_t>(pos - window + 1, 0) : 0;
}

#if RADIXLM_ISA_AVX2
// kBVec fp8 bytes → their values as floats (e4m3: times 2^-8, see to_float).
template <bool kE4m3>
inline bvec fp8_to_bvec(const uint8_t* p) {
#if RADIXLM_ISA_AVX512
  const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  __m256i h;
  if constexpr (kE4m3) {
    h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8),
                        _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7F)), 7));
  } else {
    h = _mm256_slli_epi16(w, 8);
  }
  return _mm512_cvtph_ps(h);
#else
  const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  __m128i h;
  if constexpr (kE4m3) {
    h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8),
                     _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7F)), 7));
  } else {
    h = _mm_slli_epi16(w, 8);
  }
  return _mm256_cvtph_ps(h);
#endif
}
#endif

// A row of kD values as kD / kBVec vectors (an int8 row in its rotated basis).
template <int64_t kD, typename kvT>
inline void load_row(const kvT* row, bvec (&out)[kD / kBVec]) {
  if constexpr (std::is_same_v<kvT, float>) {
    for (int64_t n = 0; n < kD / kBVec; ++n) out[n] = loadb(row + n * kBVec);
  } else if constexpr (std::is_same_v<kvT, int8_t>) {
    constexpr int64_t kBlock = radixlm::kv_int8_block(kD);
    static_assert(kBlock % kBVec == 0, "an int8 block of whole vectors");
#if RADIXLM_ISA_AVX2
    // Sign-extended and converted in registers, the scales by F16C: the portable
    // version below (a scalar float16 conversion per block, an 8-byte vector
    // convert) made an int8 row cost 3x a float32 row on AVX2.
    for (int64_t b = 0; b < kD / kBlock; ++b) {
      uint16_t bits;
      std::memcpy(&bits, row + kD + 2 * b, sizeof(bits));
      const float scale = _cvtsh_ss(bits);
      for (int64_t n = b * kBlock / kBVec; n < (b + 1) * kBlock / kBVec; ++n) {
#if RADIXLM_ISA_AVX512
        const __m512i w = _mm512_cvtepi8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + n * kBVec)));
        out[n] = _mm512_cvtepi32_ps(w) * scale;
#else
        const __m256i w = _mm256_cvtepi8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + n * kBVec)));
        out[n] = _mm256_cvtepi32_ps(w) * scale;
#endif
      }
    }
#else
    float scales[kD / kBlock];
    int8_scales(row, kD, scales);
    typedef int8_t i8vec __attribute__((vector_size(kBVec)));
    for (int64_t n = 0; n < kD / kBVec; ++n) {
      i8vec v;
      std::memcpy(&v, row + n * kBVec, sizeof(v));
      out[n] = __builtin_convertvector(v, bvec) * scales[n * kBVec / kBlock];
    }
#endif
#if RADIXLM_ISA_AVX2
  } else if constexpr (std::is_same_v<kvT, KvE4m3> || std::is_same_v<kvT, KvE5m2>) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(row);
    for (int64_t n = 0; n < kD / kBVec; ++n) {
      if constexpr (std::is_same_v<kvT, KvE4m3>) {
        out[n] = fp8_to_bvec<true>(bytes + n * kBVec) * 256.0f;
      } else {
        out[n] = fp8_to_bvec<false>(bytes + n * kBVec);
      }
    }
#endif
  } else {
    float tmp[kD];
    for (int64_t d = 0; d < kD; ++d) tmp[d] = to_float(row[d]);
    for (int64_t n = 0; n < kD / kBVec; ++n) out[n] = loadb(tmp + n * kBVec);
  }
}

// A row of n values into floats (an int8 row in its rotated basis).
template <typename kvT>
inline void row_to_float(const kvT* row, int64_t n, float* out) {
  if constexpr (std::is_same_v<kvT, int8_t>) {
    const int64_t block = radixlm::kv_int8_block(n);
    float scales[radixlm::kMaxHeadDim];
    int8_scales(row, n, scales);
    for (int64_t d = 0; d < n; ++d) out[d] = static_cast<float>(row[d]) * scales[d / block];
  } else {
    for (int64_t d = 0; d < n; ++d) out[d] = to_float(row[d]);
  }
}
