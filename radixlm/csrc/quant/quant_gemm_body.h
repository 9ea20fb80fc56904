// ISA body (isa_instantiate.h) of the quantized matmul: included by
// quant_gemm_legacy.cpp and quant_gemm_k.cpp once per level, after quant_gemm.h,
// pairs_tiles.h and <immintrin.h>. No includes here.
//
// A tile is R rows x U units of output columns (a unit: 16 columns on AVX-512, 8
// on AVX2, where a 16-column group is two units). Over K, chunk by chunk and
// sub-block by sub-block: the unit's levels are unpacked once per quad into int8
// lanes [column][4 inputs] and multiplied by every row's 4 activations (one
// broadcast 32-bit word) into an int32 lane per column (vpdpbusd; vpmaddubsw +
// vpmaddwd without VNNI); at the sub-block's end each row's integer sums turn into
// floats, times S * da, minus M * da * sum(a) where the offset is stored. The
// tile's weight is read once for all R rows; the threads split the column tiles.
// Without VNNI, levels of up to 6 bits run qtile16 instead: 16-bit sums over a
// sub-block, widened once by vpmaddwd times the integer sub-scale (see there).
// Measured on a 2-core AVX2 EPYC (Q4_K, 16-256 rows): qtile 108-112 GMAC/s,
// qtile16 166-193. From 32 rows on, a column tile's scales (qtile16) and, where
// unpacking them costs more than loading bytes, its levels (kLevelsOnce) are worked
// out once into thread-local scratch that all its row tiles read.

using namespace ::radixlm::quant;  // (the body sits in radixlm::isa_<level>)

#if RADIXLM_ISA_AVX512
struct Vec {
  static constexpr int64_t kCols = 16;
  using I = __m512i;
  using F = __m512;
  using Mask = __mmask64;
  static I load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static I zero() { return _mm512_setzero_si512(); }
  static I set1_i32(int32_t v) { return _mm512_set1_epi32(v); }
  static I set1_i8(int8_t v) { return _mm512_set1_epi8(v); }
  static I band(I a, I b) { return _mm512_and_si512(a, b); }
  static I bor(I a, I b) { return _mm512_or_si512(a, b); }
  static I bxor(I a, I b) { return _mm512_xor_si512(a, b); }
  template <int kShift> static I srl16(I a) { return _mm512_srli_epi16(a, kShift); }
  template <int kShift> static I sll16(I a) { return _mm512_slli_epi16(a, kShift); }
  static Mask load_mask(const uint8_t* p) {
    uint64_t m;
    std::memcpy(&m, p, 8);
    return m;
  }
  static I add_where(I v, Mask m, int8_t c) { return _mm512_mask_add_epi8(v, m, v, set1_i8(c)); }
  static I dot(I acc, I w, I a) {
#if RADIXLM_ISA_AVX512BF16
    return _mm512_dpbusd_epi32(acc, w, a);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, a), _mm512_set1_epi16(1)));
#endif
  }
  // acc + sum(q * a) for signed q (as |q| * sign(a, q): vpmaddubsw takes unsigned
  // weights; a is never -128 here, Q8_0 activations are within +-127)
  static I dot_signed(I acc, I q, I a) {
    const I as = _mm512_mask_sub_epi8(a, _mm512_movepi8_mask(q), zero(), a);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(q), as),
                                                   _mm512_set1_epi16(1)));
  }
  static I maddubs(I w, I a) { return _mm512_maddubs_epi16(w, a); }
  static I add16(I a, I b) { return _mm512_add_epi16(a, b); }
  static I add32(I a, I b) { return _mm512_add_epi32(a, b); }
  static I sub32(I a, I b) { return _mm512_sub_epi32(a, b); }
  template <int kShift> static I sll32(I a) { return _mm512_slli_epi32(a, kShift); }
  static I madd(I a, I b) { return _mm512_madd_epi16(a, b); }
  static I ones16() { return _mm512_set1_epi16(1); }
  // Keeps an accumulator in a register as the source orders it (without this, g++
  // reassociates an unrolled chain of adds into a tree of spilled products).
  static void pin(I& v) { asm("" : "+v"(v)); }
  // 16 int8 sub-scales, each in both 16-bit halves of its column's 32-bit lane
  static I scale_pairs(const int8_t* p) {
    const I x = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm512_or_si512(_mm512_and_si512(x, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(x, 16));
  }
  static F cvt(I a) { return _mm512_cvtepi32_ps(a); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F fzero() { return _mm512_setzero_ps(); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fnma(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  static F half(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static F from_i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static F from_u8(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
};
#else
struct Vec {
  static constexpr int64_t kCols = 8;
  using I = __m256i;
  using F = __m256;
  using Mask = uint32_t;
  static I load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static I zero() { return _mm256_setzero_si256(); }
  static I set1_i32(int32_t v) { return _mm256_set1_epi32(v); }
  static I set1_i8(int8_t v) { return _mm256_set1_epi8(v); }
  static I band(I a, I b) { return _mm256_and_si256(a, b); }
  static I bor(I a, I b) { return _mm256_or_si256(a, b); }
  static I bxor(I a, I b) { return _mm256_xor_si256(a, b); }
  template <int kShift> static I srl16(I a) { return _mm256_srli_epi16(a, kShift); }
  template <int kShift> static I sll16(I a) { return _mm256_slli_epi16(a, kShift); }
  static Mask load_mask(const uint8_t* p) {
    uint32_t m;
    std::memcpy(&m, p, 4);
    return m;
  }
  // byte b gets c where bit b of m is set
  static I add_where(I v, Mask m, int8_t c) {
    const I spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(static_cast<int32_t>(m)),
        _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2,
                         3, 3, 3, 3, 3, 3, 3, 3));
    const I bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
    const I on = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_add_epi8(v, _mm256_and_si256(on, set1_i8(c)));
  }
  static I dot(I acc, I w, I a) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1)));
  }
  static I dot_signed(I acc, I q, I a) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(q),
                                                                        _mm256_sign_epi8(a, q)),
                                                   _mm256_set1_epi16(1)));
  }
  static I maddubs(I w, I a) { return _mm256_maddubs_epi16(w, a); }
  static I add16(I a, I b) { return _mm256_add_epi16(a, b); }
  static I add32(I a, I b) { return _mm256_add_epi32(a, b); }
  static I sub32(I a, I b) { return _mm256_sub_epi32(a, b); }
  template <int kShift> static I sll32(I a) { return _mm256_slli_epi32(a, kShift); }
  static I madd(I a, I b) { return _mm256_madd_epi16(a, b); }
  static I ones16() { return _mm256_set1_epi16(1); }
  static void pin(I& v) { asm("" : "+x"(v)); }
  static I scale_pairs(const int8_t* p) {
    const I x = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm256_or_si256(_mm256_and_si256(x, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(x, 16));
  }
  static F cvt(I a) { return _mm256_cvtepi32_ps(a); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F fzero() { return _mm256_setzero_ps(); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F fnma(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static F half(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static F from_i8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static F from_u8(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
};
#endif

constexpr int64_t kUnitsPerGroup = kGroup / Vec::kCols;
constexpr int64_t kTileUnits = 2;  // AVX-512: 32 columns; AVX2: 16
constexpr int64_t kTileRows = 4;
// vpdpbusd takes unsigned 8-bit levels whole; without it, Q8_0 runs signed (sign trick).
constexpr bool kVnni = RADIXLM_ISA_AVX512BF16 != 0;

// Where one unit's data sits in a chunk.
struct UnitPtr {
  const uint8_t* chunk;  // the chunk of the unit's group
  int64_t half;          // which half of the group (AVX2), else 0
};

// The levels of quad q (0 .. sub/4) of one unit in sub-block planes p, as bytes.
template <int kBits, int kSub>
inline typename Vec::I levels(const uint8_t* p, int64_t half, int q) {
  using V = Vec;
  constexpr int kQuads = kSub / 4;
  const int64_t off = half * Vec::kCols * 4;
  if constexpr (kBits == 8) {
    return V::load(p + q * 64 + off);
  } else if constexpr (kBits >= 4) {
    const typename V::I nib = V::load(p + q / 2 * 64 + off);
    typename V::I v = V::band(q % 2 == 0 ? nib : V::template srl16<4>(nib), V::set1_i8(0x0F));
    if constexpr (kBits == 5) {
      v = V::add_where(v, V::load_mask(p + kQuads / 2 * 64 + q * 8 + half * Vec::kCols / 2), 16);
    } else if constexpr (kBits == 6) {
      const typename V::I crumb = V::load(p + kQuads / 2 * 64 + q / 4 * 64 + off);
      typename V::I hi;
      switch (q % 4) {
        case 0: hi = V::template sll16<4>(crumb); break;
        case 1: hi = V::template sll16<2>(crumb); break;
        case 2: hi = crumb; break;
        default: hi = V::template srl16<2>(crumb); break;
      }
      v = V::bor(v, V::band(hi, V::set1_i8(0x30)));
    }
    return v;
  } else {
    const typename V::I crumb = V::load(p + q / 4 * 64 + off);
    typename V::I v;
    switch (q % 4) {
      case 0: v = crumb; break;
      case 1: v = V::template srl16<2>(crumb); break;
      case 2: v = V::template srl16<4>(crumb); break;
      default: v = V::template srl16<6>(crumb); break;
    }
    v = V::band(v, V::set1_i8(0x03));
    if constexpr (kBits == 3) {
      v = V::add_where(v, V::load_mask(p + kQuads / 4 * 64 + q * 8 + half * Vec::kCols / 2), 4);
    }
    return v;
  }
}

constexpr Format format_of(int32_t type) {
  switch (type) {
    case kQ4_0: return {kQ4_0, 4, 32, 32, 18, false, false, 8};
    case kQ4_1: return {kQ4_1, 4, 32, 32, 20, false, true, 0};
    case kQ5_0: return {kQ5_0, 5, 32, 32, 22, false, false, 16};
    case kQ5_1: return {kQ5_1, 5, 32, 32, 24, false, true, 0};
    case kQ8_0: return {kQ8_0, 8, 32, 32, 34, false, false, 128};
    case kQ2_K: return {kQ2_K, 2, 16, 256, 84, true, true, 0};
    case kQ3_K: return {kQ3_K, 3, 16, 256, 110, true, false, 4};
    case kQ4_K: return {kQ4_K, 4, 32, 256, 144, true, true, 0};
    case kQ5_K: return {kQ5_K, 5, 32, 256, 176, true, true, 0};
    default: return {kQ6_K, 6, 16, 256, 210, true, false, 32};
  }
}

// One tile: rows [0, kR) of act (already offset), units [0, kU) starting at `units`.
template <int32_t kType, int64_t kR, int64_t kU, bool kPre>
void qtile(const ChunkLayout& cl, const UnitPtr* units_at_chunk0, const typename Vec::I* pre,
           const QuantizedRows& act, int64_t row0, float (*out)[kU * Vec::kCols]) {
  using V = Vec;
  constexpr Format f = format_of(kType);
  constexpr int kQuads = f.sub / 4;
  // Q8_0 without VNNI: signed levels (u - 128) and no offset term.
  constexpr bool kSigned8 = f.bits == 8 && !kVnni;
  constexpr int32_t kMinMul = kSigned8 ? 0 : f.min_mul;
  typename V::F acc[kR][kU];
  for (int64_t r = 0; r < kR; ++r) {
    for (int64_t u = 0; u < kU; ++u) acc[r][u] = V::fzero();
  }
  const int64_t subs_per_act = f.k_quant ? cl.subs : 1;  // sub-blocks per activation block
  for (int64_t c = 0; c < cl.chunks; ++c) {
    for (int64_t j = 0; j < cl.subs; ++j) {
      const int64_t sub_index = c * cl.subs + j;  // over the whole K
      const int64_t act_block = sub_index / subs_per_act;
      typename V::F s[kU], mv[kU];
      const uint8_t* planes[kU];
      for (int64_t u = 0; u < kU; ++u) {
        const uint8_t* ch = units_at_chunk0[u].chunk + c * cl.bytes;
        const int64_t h = units_at_chunk0[u].half * V::kCols;
        if constexpr (f.k_quant) {
          const typename V::F d = V::half(reinterpret_cast<const uint16_t*>(ch + cl.d_off) + h);
          s[u] = V::mul(d, V::from_i8(reinterpret_cast<const int8_t*>(ch + cl.sc_off) + j * kGroup + h));
          if constexpr (f.stored_min) {
            const typename V::F dm = V::half(reinterpret_cast<const uint16_t*>(ch + cl.dmin_off) + h);
            mv[u] = V::mul(dm, V::from_u8(ch + cl.m_off + j * kGroup + h));
          }
        } else {
          s[u] = V::half(reinterpret_cast<const uint16_t*>(ch + cl.d_off) + j * kGroup + h);
          if constexpr (f.stored_min) {
            mv[u] = V::half(reinterpret_cast<const uint16_t*>(ch + cl.dmin_off) + j * kGroup + h);
          }
        }
        planes[u] = ch + cl.planes_off + j * cl.sub_bytes;
      }
      typename V::I isum[kR][kU];
      for (int64_t r = 0; r < kR; ++r) {
        const int64_t row = row0 + r;
        int32_t init = 0;
        if constexpr (kMinMul != 0) {
          const int32_t bs = f.sub == 16 ? act.bs16[row * act.ld_16 + sub_index]
                                         : act.bs32[row * act.ld_32 + sub_index];
          init = -kMinMul * bs;
        }
        for (int64_t u = 0; u < kU; ++u) isum[r][u] = V::set1_i32(init);
      }
      const int8_t* aq = act.q + row0 * act.ld_q + sub_index * f.sub;
      for (int q = 0; q < kQuads; ++q) {
        typename V::I w[kU];
        for (int64_t u = 0; u < kU; ++u) {
          if constexpr (kPre) {
            w[u] = pre[(sub_index * kQuads + q) * kTileUnits + u];
          } else {
            w[u] = levels<f.bits, f.sub>(planes[u], units_at_chunk0[u].half, q);
          }
          if constexpr (kSigned8) w[u] = V::bxor(w[u], V::set1_i8(static_cast<int8_t>(0x80)));
        }
        for (int64_t r = 0; r < kR; ++r) {
          int32_t a4;
          std::memcpy(&a4, aq + r * act.ld_q + q * 4, 4);
          const typename V::I a = V::set1_i32(a4);
          for (int64_t u = 0; u < kU; ++u) {
            if constexpr (kSigned8) {
              isum[r][u] = V::dot_signed(isum[r][u], w[u], a);
            } else {
              isum[r][u] = V::dot(isum[r][u], w[u], a);
            }
            V::pin(isum[r][u]);
          }
        }
      }
      for (int64_t r = 0; r < kR; ++r) {
        const int64_t row = row0 + r;
        const typename V::F da = V::set1(act.d[row * act.ld_d + act_block]);
        for (int64_t u = 0; u < kU; ++u) {
          acc[r][u] = V::fma(V::cvt(isum[r][u]), V::mul(s[u], da), acc[r][u]);
          if constexpr (f.stored_min) {
            const float bsf = f.sub == 16 ? act.bsf16[row * act.ld_16 + sub_index]
                                          : act.bsf32[row * act.ld_32 + sub_index];
            acc[r][u] = V::fnma(mv[u], V::set1(bsf), acc[r][u]);
          }
        }
      }
    }
  }
  for (int64_t r = 0; r < kR; ++r) {
    for (int64_t u = 0; u < kU; ++u) V::store(out[r] + u * V::kCols, acc[r][u]);
  }
}

// The tile without VNNI for levels of at most 6 bits. vpmaddubsw's 16-bit sums of
// two products add up in 16 bits over a sub-block (over half of one for 5- and 6-bit
// levels, to stay within 2^15 with activations in [-128, 127]); then one vpmaddwd per
// row and unit widens them to 32 bits times the sub-block's integer scale (K-quants)
// or 1 (legacy formats). That is one multiply per quad instead of two, and the
// K-quants turn their integer sums into floats once per super-block.
template <int32_t kType>
constexpr int flush_quads() {
  constexpr Format f = format_of(kType);
  constexpr int kQuads = f.sub / 4;
  constexpr int kFit = 32767 / (2 * ((1 << f.bits) - 1) * 128);
  return kFit < kQuads ? kFit : kQuads;
}

// One unit's scales for one sub-block, worked out once per column tile (a tile's
// row tiles all use them): the integer sub-scale in both 16-bit halves of each
// 32-bit lane (K-quants), the float scale (legacy: S; K-quants: the super-block's d,
// kept in the chunk's first sub-block) and the offset M.
struct UnitScales {
  typename Vec::I mult;
  typename Vec::F s, mv;
};

template <int32_t kType>
inline void unit_scales(const ChunkLayout& cl, const UnitPtr& unit, int64_t c, int64_t j, UnitScales& o) {
  using V = Vec;
  constexpr Format f = format_of(kType);
  const uint8_t* ch = unit.chunk + c * cl.bytes;
  const int64_t h = unit.half * V::kCols;
  o.mv = V::fzero();
  if constexpr (f.k_quant) {
    o.mult = V::scale_pairs(reinterpret_cast<const int8_t*>(ch + cl.sc_off) + j * kGroup + h);
    o.s = V::half(reinterpret_cast<const uint16_t*>(ch + cl.d_off) + h);
    if constexpr (f.stored_min) {
      const typename V::F dm = V::half(reinterpret_cast<const uint16_t*>(ch + cl.dmin_off) + h);
      o.mv = V::mul(dm, V::from_u8(ch + cl.m_off + j * kGroup + h));
    }
  } else {
    o.mult = V::ones16();
    o.s = V::half(reinterpret_cast<const uint16_t*>(ch + cl.d_off) + j * kGroup + h);
    if constexpr (f.stored_min) {
      o.mv = V::half(reinterpret_cast<const uint16_t*>(ch + cl.dmin_off) + j * kGroup + h);
    }
  }
}

template <int32_t kType>
void tile_scales(const ChunkLayout& cl, const UnitPtr* units, int64_t nu, UnitScales* out) {
  for (int64_t c = 0; c < cl.chunks; ++c) {
    for (int64_t j = 0; j < cl.subs; ++j) {
      for (int64_t u = 0; u < nu; ++u) unit_scales<kType>(cl, units[u], c, j, out[(c * cl.subs + j) * kTileUnits + u]);
    }
  }
}

// A column tile's levels, unpacked once for all its row tiles: [sub-block][quad][unit]
// vectors of bytes, as `levels` gives them.
template <int32_t kType>
void tile_levels(const ChunkLayout& cl, const UnitPtr* units, int64_t nu, typename Vec::I* out) {
  constexpr Format f = format_of(kType);
  constexpr int kQuads = f.sub / 4;
  for (int64_t c = 0; c < cl.chunks; ++c) {
    for (int64_t j = 0; j < cl.subs; ++j) {
      typename Vec::I* o = out + (c * cl.subs + j) * kQuads * kTileUnits;
      for (int64_t u = 0; u < nu; ++u) {
        const uint8_t* planes = units[u].chunk + c * cl.bytes + cl.planes_off + j * cl.sub_bytes;
        for (int q = 0; q < kQuads; ++q) o[q * kTileUnits + u] = levels<f.bits, f.sub>(planes, units[u].half, q);
      }
    }
  }
}

template <int32_t kType, int64_t kR, int64_t kU, bool kPre, bool kPreLevels>
void qtile16(const ChunkLayout& cl, const UnitPtr* units_at_chunk0, const UnitScales* scales,
             const typename Vec::I* pre, const QuantizedRows& act, int64_t row0,
             float (*out)[kU * Vec::kCols]) {
  using V = Vec;
  using I = typename V::I;
  using F = typename V::F;
  constexpr Format f = format_of(kType);
  constexpr int kQuads = f.sub / 4;
  constexpr int kFlush = flush_quads<kType>();
  static_assert(kFlush > 0 && kQuads % kFlush == 0, "16-bit sums must fit");
  // K-quants' implied offsets (M = c * d * sc, c a power of two) stay integer:
  // sc * (sum(u * a) - c * sum(a)), the second term a vpmaddwd and a shift.
  constexpr int kOffsetShift = f.min_mul == 4 ? 2 : f.min_mul == 32 ? 5 : -1;
  static_assert(!f.k_quant || f.stored_min || kOffsetShift > 0, "implied K offset is 4 or 32");
  F acc[kR][kU];
  I isum[kR][kU];
  for (int64_t r = 0; r < kR; ++r) {
    for (int64_t u = 0; u < kU; ++u) acc[r][u] = V::fzero();
  }
  for (int64_t c = 0; c < cl.chunks; ++c) {
    if constexpr (f.k_quant) {
      for (int64_t r = 0; r < kR; ++r) {
        for (int64_t u = 0; u < kU; ++u) isum[r][u] = V::zero();
      }
    }
    for (int64_t j = 0; j < cl.subs; ++j) {
      const int64_t sub_index = c * cl.subs + j;  // over the whole K
      I mult[kU];
      F s[kU], mv[kU];
      const uint8_t* planes[kU];
      for (int64_t u = 0; u < kU; ++u) {
        const uint8_t* ch = units_at_chunk0[u].chunk + c * cl.bytes;
        if constexpr (kPre) {
          const UnitScales& us = scales[sub_index * kTileUnits + u];
          mult[u] = f.k_quant ? us.mult : V::ones16();
          s[u] = us.s;
          mv[u] = us.mv;
        } else {
          UnitScales us;
          unit_scales<kType>(cl, units_at_chunk0[u], c, j, us);
          mult[u] = us.mult;
          s[u] = us.s;
          mv[u] = us.mv;
        }
        planes[u] = ch + cl.planes_off + j * cl.sub_bytes;
      }
      if constexpr (!f.k_quant) {  // legacy: one sub-block per scale; implied offsets in the init
        for (int64_t r = 0; r < kR; ++r) {
          const int32_t init = f.min_mul == 0 ? 0 : -f.min_mul * act.bs32[(row0 + r) * act.ld_32 + sub_index];
          for (int64_t u = 0; u < kU; ++u) isum[r][u] = V::set1_i32(init);
        }
      } else if constexpr (!f.stored_min) {
        for (int64_t r = 0; r < kR; ++r) {
          const int32_t bs = f.sub == 16 ? act.bs16[(row0 + r) * act.ld_16 + sub_index]
                                         : act.bs32[(row0 + r) * act.ld_32 + sub_index];
          const I b = V::set1_i32(bs & 0xFFFF);  // |bs| <= 128 * 32: one 16-bit half
          for (int64_t u = 0; u < kU; ++u) {
            const I off = V::madd(mult[u], b);
            isum[r][u] = V::sub32(isum[r][u], V::template sll32<kOffsetShift>(off));
          }
        }
      }
      const int8_t* aq = act.q + row0 * act.ld_q + sub_index * f.sub;
#pragma GCC unroll 4
      for (int q0 = 0; q0 < kQuads; q0 += kFlush) {
        I part[kR][kU];
        for (int64_t r = 0; r < kR; ++r) {
          for (int64_t u = 0; u < kU; ++u) part[r][u] = V::zero();
        }
#pragma GCC unroll 8
        for (int q = q0; q < q0 + kFlush; ++q) {
          I w[kU];
          for (int64_t u = 0; u < kU; ++u) {
            if constexpr (kPreLevels) {
              w[u] = pre[(sub_index * kQuads + q) * kTileUnits + u];
            } else {
              w[u] = levels<f.bits, f.sub>(planes[u], units_at_chunk0[u].half, q);
            }
          }
          for (int64_t r = 0; r < kR; ++r) {
            int32_t a4;
            std::memcpy(&a4, aq + r * act.ld_q + q * 4, 4);
            const I a = V::set1_i32(a4);
            for (int64_t u = 0; u < kU; ++u) {
              part[r][u] = V::add16(part[r][u], V::maddubs(w[u], a));
              V::pin(part[r][u]);
            }
          }
        }
        for (int64_t r = 0; r < kR; ++r) {
          for (int64_t u = 0; u < kU; ++u) isum[r][u] = V::add32(isum[r][u], V::madd(part[r][u], mult[u]));
        }
      }
      if constexpr (!f.k_quant) {
        for (int64_t r = 0; r < kR; ++r) {
          const int64_t row = row0 + r;
          const F da = V::set1(act.d[row * act.ld_d + sub_index]);
          for (int64_t u = 0; u < kU; ++u) {
            acc[r][u] = V::fma(V::cvt(isum[r][u]), V::mul(s[u], da), acc[r][u]);
            if constexpr (f.stored_min) {
              acc[r][u] = V::fnma(mv[u], V::set1(act.bsf32[row * act.ld_32 + sub_index]), acc[r][u]);
            }
          }
        }
      } else if constexpr (f.stored_min) {
        for (int64_t r = 0; r < kR; ++r) {
          const int64_t row = row0 + r;
          const float bsf = f.sub == 16 ? act.bsf16[row * act.ld_16 + sub_index]
                                        : act.bsf32[row * act.ld_32 + sub_index];
          for (int64_t u = 0; u < kU; ++u) acc[r][u] = V::fnma(mv[u], V::set1(bsf), acc[r][u]);
        }
      }
    }
    if constexpr (f.k_quant) {  // the super-block's integer sums, times d * da
      for (int64_t u = 0; u < kU; ++u) {
        const F d = kPre ? scales[c * cl.subs * kTileUnits + u].s
                                      : V::half(reinterpret_cast<const uint16_t*>(units_at_chunk0[u].chunk + c * cl.bytes + cl.d_off) +
                                                units_at_chunk0[u].half * V::kCols);
        for (int64_t r = 0; r < kR; ++r) {
          const F da = V::set1(act.d[(row0 + r) * act.ld_d + c]);
          acc[r][u] = V::fma(V::cvt(isum[r][u]), V::mul(d, da), acc[r][u]);
        }
      }
    }
  }
  for (int64_t r = 0; r < kR; ++r) {
    for (int64_t u = 0; u < kU; ++u) V::store(out[r] + u * V::kCols, acc[r][u]);
  }
}

// Writes a tile's float results (cols columns of rows rows) to the output.
inline void store_tile(const float* tile, int64_t tile_ld, int64_t rows, int64_t cols,
                       const GemmArgs& g, int64_t row0, int64_t col0) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = tile + r * tile_ld;
    if (g.out_bf16) {
      auto* o = static_cast<c10::BFloat16*>(g.out) + (row0 + r) * g.ldo + col0;
      for (int64_t c = 0; c < cols; ++c) {
        o[c] = c10::BFloat16(src[c] + (g.bias != nullptr ? g.bias[col0 + c] : 0.0f));
      }
    } else {
      float* o = static_cast<float*>(g.out) + (row0 + r) * g.ldo + col0;
      for (int64_t c = 0; c < cols; ++c) o[c] = src[c] + (g.bias != nullptr ? g.bias[col0 + c] : 0.0f);
    }
  }
}

// From this many rows on, a column tile's scales are worked out once for all its row
// tiles (below, each row tile works them out as it goes: for a few rows, storing and
// reloading them costs more than it saves).
constexpr int64_t kScalesOnceRows = 32;
// From as many rows, its levels are unpacked once into bytes (tile_levels) that every row tile loads
// as they are, for the formats whose unpacking costs more than that load: 2, 3, 5 and
// 6 bits, and 4 bits without VNNI (where the tile's products cost more). Measured at
// 512 rows (2-core AMD EPYC with AVX-512 VNNI, RADIXLM_ISA capping it; G multiply-adds
// a second, inline -> once): avx2 Q4_K 208 -> 223, Q6_K 126 -> 153; avx512 Q4_K
// 229 -> 241, Q6_K 155 -> 185; avx512bf16 Q6_K 210 -> 221, Q5_K 203 -> 239, Q3_K
// 211 -> 229, but Q4_K 245 -> 237, Q4_0 288 -> 282, Q8_0 290 -> 268.
template <int32_t kType>
constexpr bool kLevelsOnce = format_of(kType).bits != 8 && (format_of(kType).bits != 4 || !kVnni);

// buf resized to hold `bytes` from a 64-byte aligned start, which it returns.
inline uint8_t* aligned_scratch(std::vector<uint8_t>& buf, int64_t bytes) {
  buf.resize(static_cast<size_t>(bytes) + 64);
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~static_cast<uintptr_t>(63));
}

// Which tile a format runs on at this ISA level.
template <int32_t kType>
constexpr bool kInt16Sums = !kVnni && format_of(kType).bits != 8;

template <int32_t kType>
void gemm(const GemmArgs& g) {
  constexpr Format f = format_of(kType);
  const ChunkLayout cl(f, g.k);
  const int64_t group_bytes = cl.group_bytes();
  const int64_t units = g.groups * kUnitsPerGroup;
  const int64_t tiles = (units + kTileUnits - 1) / kTileUnits;
  if (g.m == 0 || g.n == 0) return;
  radixlm::claim_parallel(tiles, [&](int64_t t, int64_t) {
    // this column tile's UnitScales and unpacked levels, 64-byte aligned
    thread_local std::vector<uint8_t> scale_bytes, level_bytes;
    UnitScales* scales = nullptr;
    typename Vec::I* pre = nullptr;
    const int64_t u0 = t * kTileUnits, nu = std::min(kTileUnits, units - u0);
    UnitPtr ptrs[kTileUnits];
    for (int64_t u = 0; u < nu; ++u) {
      ptrs[u] = {g.w + (u0 + u) / kUnitsPerGroup * group_bytes, (u0 + u) % kUnitsPerGroup};
    }
    const int64_t col0 = u0 * Vec::kCols;
    const int64_t cols = std::min(nu * Vec::kCols, g.n - col0);
    if (cols <= 0) return;  // (a padding unit past the last column)
    if (kInt16Sums<kType> && g.m >= kScalesOnceRows) {
      scales = reinterpret_cast<UnitScales*>(
          aligned_scratch(scale_bytes, cl.chunks * cl.subs * kTileUnits * sizeof(UnitScales)));
      tile_scales<kType>(cl, ptrs, nu, scales);
    }
    if (kLevelsOnce<kType> && g.m >= kScalesOnceRows) {
      pre = reinterpret_cast<typename Vec::I*>(
          aligned_scratch(level_bytes, g.k / 4 * kTileUnits * sizeof(typename Vec::I)));
      tile_levels<kType>(cl, ptrs, nu, pre);
    }
    const int64_t row_tiles = (g.m + kTileRows - 1) / kTileRows;
    const int64_t tile_rows = (g.m + row_tiles - 1) / row_tiles;
    for (int64_t r0 = 0; r0 < g.m; r0 += tile_rows) {
      const int64_t nr = std::min(tile_rows, g.m - r0);
      radixlm::with_count<kTileUnits>(nu, [&](auto nu_c) {
        radixlm::with_count<kTileRows>(nr, [&](auto nr_c) {
          constexpr int64_t kU = decltype(nu_c)::value, kR = decltype(nr_c)::value;
          alignas(64) float tmp[kR][kU * Vec::kCols];
          if constexpr (kInt16Sums<kType>) {
            if (scales != nullptr && pre != nullptr) {
              qtile16<kType, kR, kU, true, true>(cl, ptrs, scales, pre, *g.act, r0, tmp);
            } else if (scales != nullptr) {
              qtile16<kType, kR, kU, true, false>(cl, ptrs, scales, nullptr, *g.act, r0, tmp);
            } else {  // (levels once come only with scales once: the same row count)
              qtile16<kType, kR, kU, false, false>(cl, ptrs, nullptr, nullptr, *g.act, r0, tmp);
            }
          } else if (pre != nullptr) {
            qtile<kType, kR, kU, true>(cl, ptrs, pre, *g.act, r0, tmp);
          } else {
            qtile<kType, kR, kU, false>(cl, ptrs, nullptr, *g.act, r0, tmp);
          }
          store_tile(&tmp[0][0], kU * Vec::kCols, nr, cols, g, r0, col0);
        });
      });
    }
  });
}
