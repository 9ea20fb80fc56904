// Paged attention's blocked path (an ISA body fragment, included by
// attention_body.h): flash attention for long extends (prefill chunks), in float
// vectors at every level and, at the avx512bf16 level, in the CPU's bf16 dot
// products (vdpbf16ps) for bf16 queries and K/V: two bf16 products summed into
// each float lane, twice the fp32 FMA rate, which no compiler emits by itself.

// Long extends (prefill chunks): flash attention over the pool in blocks. A task
// is kQBlock query rows (more for small groups: kScoreRows) of one request and one
// KV head (with the group's heads: rows x group score rows). Keys come kKBlock at a time; each block is converted
// once into float scratch, K transposed ([D][kKBlock], so the scores of a row
// vectorize over keys without a horizontal sum) and V as it is ([kKBlock][D]),
// and then serves every score row of the task. The softmax is online (running
// max and sum per row, the accumulator rescaled when the max grows), so scratch
// does not grow with the sequence; blocks past a row's position are skipped, and
// under a sliding window the keys before the task's first row's window are never
// read (each row masks its own window's start within a block). Quantized rows are
// converted as the block is (an int8 pool's in its rotated basis: the query rows
// are rotated into it first, the output rows back).
constexpr int64_t kRowwiseMaxRows = 16;  // extends up to this use attend_group
constexpr int64_t kQBlock = 64;
// A task's least score rows (attention_body.h): each key block, converted once per
// task, serves at least this many (kQBlock query rows x a group of 4 heads, or 256
// query rows of one head: 0.83-0.91x of the attention's time at SmolLM2-1.7B's 32/32
// heads against 64 rows).
constexpr int64_t kScoreRows = 256;
constexpr int64_t kKBlock = 64;

struct BlockScratch {
  std::vector<float> qf, kt, vb, acc, m, l;
  std::vector<uint32_t> q2, k2, v2;  // the bf16 path's pairs (see block_attend_bf16)
};


// max(x[from .. to)) for to <= kKBlock, -inf for an empty range: lane-wise over the
// block, where a loop of std::max stays a chain of scalar compares (12% of a
// prefill's time).
inline float block_row_max(const float* x, int64_t from, int64_t to) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float partial[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) partial[l] = kNegInf;
  for (int64_t j0 = 0; j0 < kKBlock; j0 += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) {
      const float v = j0 + l < to && j0 + l >= from ? x[j0 + l] : kNegInf;
      partial[l] = partial[l] < v ? v : partial[l];
    }
  }
  float half[kLanes / 2];
  for (int64_t l = 0; l < kLanes / 2; ++l) half[l] = std::max(partial[l], partial[l + kLanes / 2]);
  float m = half[0];
  for (int64_t l = 1; l < kLanes / 2; ++l) m = std::max(m, half[l]);
  return m;
}

// Score rows r0 .. r0 + kRows of a task against one key block: out[i][j] = q_i . k_j,
// kt the block transposed ([kD][kKBlock]); keys kN vectors at a time.
template <int64_t kD, int64_t kRows>
inline void block_scores(const float* qf, const float* kt, float (*out)[kKBlock]) {
  constexpr int64_t kN = std::min(kKBlock / kBVec, kBlockVecs);
  for (int64_t c0 = 0; c0 < kKBlock; c0 += kN * kBVec) {
    bvec acc[kRows][kN] = {};
    for (int64_t d = 0; d < kD; ++d) {
      bvec kd[kN];
      for (int64_t n = 0; n < kN; ++n) kd[n] = loadb(kt + d * kKBlock + c0 + n * kBVec);
      for (int64_t i = 0; i < kRows; ++i) {
        const float qd = qf[i * kD + d];
        for (int64_t n = 0; n < kN; ++n) acc[i][n] += qd * kd[n];
      }
    }
    for (int64_t i = 0; i < kRows; ++i) {
      for (int64_t n = 0; n < kN; ++n) storeb(out[i] + c0 + n * kBVec, acc[i][n]);
    }
  }
}

// acc_i <- acc_i * correction_i + sum_j p_i[j] v_j for rows i < kRows (p zero outside
// keys from .. to), vb the block's values ([kKBlock][kD]); dims kN vectors at a time.
template <int64_t kD, int64_t kRows>
inline void block_values(float* acc, const float (*p)[kKBlock], const float* correction,
                         const float* vb, int64_t from, int64_t to) {
  constexpr int64_t kN = std::min(kD / kBVec, kBlockVecs);
  for (int64_t d0 = 0; d0 < kD; d0 += kN * kBVec) {
    bvec a[kRows][kN];
    for (int64_t i = 0; i < kRows; ++i) {
      for (int64_t n = 0; n < kN; ++n) {
        a[i][n] = loadb(acc + i * kD + d0 + n * kBVec) * correction[i];
      }
    }
    for (int64_t j = from; j < to; ++j) {
      bvec vj[kN];
      for (int64_t n = 0; n < kN; ++n) vj[n] = loadb(vb + j * kD + d0 + n * kBVec);
      for (int64_t i = 0; i < kRows; ++i) {
        const float pj = p[i][j];
        for (int64_t n = 0; n < kN; ++n) a[i][n] += pj * vj[n];
      }
    }
    for (int64_t i = 0; i < kRows; ++i) {
      for (int64_t n = 0; n < kN; ++n) storeb(acc + i * kD + d0 + n * kBVec, a[i][n]);
    }
  }
}

#if RADIXLM_ISA_AVX512BF16
// The bf16 path. vdpbf16ps multiplies two bf16 pairs per float lane and adds both
// products (exact in float) to the lane, so each operand is laid out in pairs
// along the summed index: a query row as it lies (d, d + 1 adjacent), the key
// block as [kD / 2][kKBlock] words of (k_j[d], k_j[d + 1]) so that one load holds
// 16 keys' pair d, and the value block as [kKBlock / 2][kD] words of
// (v_j[d], v_j+1[d]). The probabilities are rounded to bf16 for the second
// product (as GPU flash attention does); the sums stay in float.
constexpr bool kHasBf16Dot = true;

inline __m512bh as_bh(__m512i v) { return reinterpret_cast<__m512bh&>(v); }

inline uint32_t bf16_pair(const c10::BFloat16* p) {
  uint32_t w;
  std::memcpy(&w, p, sizeof(w));
  return w;
}

// The bf16 bits of a row's values (rows of another format converted and rounded to
// nearest even).
template <int64_t kD, typename kvT>
inline void row_bf16_bits(const kvT* row, uint16_t (&bits)[kD]) {
  if constexpr (std::is_same_v<kvT, c10::BFloat16>) {
    std::memcpy(bits, row, sizeof(bits));
  } else {
    float tmp[kD];
    row_to_float(row, kD, tmp);
    for (int64_t d = 0; d < kD; ++d) bits[d] = c10::BFloat16(tmp[d]).x;
  }
}

template <int64_t kD, typename kvT>
inline void pack_block_bf16(const KvRows<kvT>& kv, const int64_t* slots, int64_t nk,
                            uint32_t* k2, uint32_t* v2) {
  uint16_t row[kD];
  for (int64_t j = 0; j < kKBlock; ++j) {
    if (j < nk) {
      row_bf16_bits<kD>(kv.key(slots[j]), row);
    } else {
      std::memset(row, 0, sizeof(row));
    }
    for (int64_t p = 0; p < kD / 2; ++p) {
      k2[p * kKBlock + j] = uint32_t(row[2 * p]) | uint32_t(row[2 * p + 1]) << 16;
    }
  }
  uint16_t even[kD], odd[kD];
  for (int64_t j = 0; j < kKBlock; j += 2) {
    for (int64_t t = 0; t < 2; ++t) {
      uint16_t(&dst)[kD] = t == 0 ? even : odd;
      if (j + t < nk) {
        row_bf16_bits<kD>(kv.value(slots[j + t]), dst);
      } else {
        std::memset(dst, 0, sizeof(dst));
      }
    }
    uint32_t* out = v2 + (j / 2) * kD;
    for (int64_t d = 0; d < kD; ++d) out[d] = uint32_t(even[d]) | uint32_t(odd[d]) << 16;
  }
}

// exp(x) lane-wise, as exp_of: x = n ln2 + r, e^r by its polynomial, times 2^n
// (vscalefps).
inline __m512 exp512(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(_mm512_set1_ps(-88.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f),
                                   _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x));
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f,
                        5.0000001201e-1f}) {
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  }
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// Lanes 16 n .. 16 n + 15 of a block row that sees keys from .. to of the block.
inline __mmask16 visible_lanes(int64_t from, int64_t to, int64_t n) {
  const int64_t hi = std::clamp<int64_t>(to - n * kVec, 0, kVec);
  const int64_t lo = std::clamp<int64_t>(from - n * kVec, 0, kVec);
  return static_cast<__mmask16>(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

// One key block for kRows score rows, in registers from the scores to the values:
// s = scale * q . k (q2: [kRows][kD / 2] pairs), the online softmax update of m
// and l, p rounded to bf16 pairs, acc <- acc * correction + p V. Row i sees keys
// from[i] .. to[i] of the block, all rows together least .. most; rows that see none
// of the block keep their state.
template <int64_t kD, int64_t kRows>
inline void block_attend_bf16(const uint32_t* q2, const uint32_t* k2, const uint32_t* v2,
                              float scale, const int64_t* from, const int64_t* to, int64_t least,
                              int64_t most, float* m, float* l, float* acc) {
  constexpr int64_t kN = kKBlock / kVec;
  __m512 sc[kRows][kN];
  for (int64_t i = 0; i < kRows; ++i) {
    for (int64_t n = 0; n < kN; ++n) sc[i][n] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < kD / 2; ++p) {
    __m512bh kv[kN];
    for (int64_t n = 0; n < kN; ++n) kv[n] = as_bh(_mm512_loadu_si512(k2 + p * kKBlock + n * kVec));
    for (int64_t i = 0; i < kRows; ++i) {
      const __m512bh qp = as_bh(_mm512_set1_epi32(static_cast<int>(q2[i * kD / 2 + p])));
      for (int64_t n = 0; n < kN; ++n) sc[i][n] = _mm512_dpbf16_ps(sc[i][n], qp, kv[n]);
    }
  }
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  alignas(64) uint32_t p2[kRows][kKBlock / 2];
  float correction[kRows];
  for (int64_t i = 0; i < kRows; ++i) {
    if (to[i] <= from[i]) {
      correction[i] = 1.0f;
      std::memset(p2[i], 0, sizeof(p2[i]));
      continue;
    }
    __m512 mx = neg_inf;
    for (int64_t n = 0; n < kN; ++n) {
      sc[i][n] = _mm512_mask_mul_ps(neg_inf, visible_lanes(from[i], to[i], n), sc[i][n],
                                    _mm512_set1_ps(scale));
      mx = _mm512_max_ps(mx, sc[i][n]);
    }
    const float new_max = std::max(m[i], _mm512_reduce_max_ps(mx));
    correction[i] = std::exp(m[i] - new_max);  // 0 on the row's first block (m = -inf)
    __m512 sum = _mm512_setzero_ps();
    for (int64_t n = 0; n < kN; ++n) {
      sc[i][n] = _mm512_maskz_mov_ps(visible_lanes(from[i], to[i], n),
                                     exp512(_mm512_sub_ps(sc[i][n], _mm512_set1_ps(new_max))));
      sum = _mm512_add_ps(sum, sc[i][n]);
    }
    l[i] = l[i] * correction[i] + _mm512_reduce_add_ps(sum);
    m[i] = new_max;
    for (int64_t n = 0; n < kN / 2; ++n) {
      const __m512bh b = _mm512_cvtne2ps_pbh(sc[i][2 * n + 1], sc[i][2 * n]);
      std::memcpy(p2[i] + n * kVec, &b, sizeof(b));
    }
  }
  constexpr int64_t kM = kD / kVec;
  __m512 a[kRows][kM];
  for (int64_t i = 0; i < kRows; ++i) {
    const __m512 c = _mm512_set1_ps(correction[i]);
    for (int64_t n = 0; n < kM; ++n) a[i][n] = _mm512_mul_ps(_mm512_loadu_ps(acc + i * kD + n * kVec), c);
  }
  for (int64_t jp = least / 2; jp < (most + 1) / 2; ++jp) {
    __m512bh vv[kM];
    for (int64_t n = 0; n < kM; ++n) vv[n] = as_bh(_mm512_loadu_si512(v2 + jp * kD + n * kVec));
    for (int64_t i = 0; i < kRows; ++i) {
      const __m512bh pp = as_bh(_mm512_set1_epi32(static_cast<int>(p2[i][jp])));
      for (int64_t n = 0; n < kM; ++n) a[i][n] = _mm512_dpbf16_ps(a[i][n], pp, vv[n]);
    }
  }
  for (int64_t i = 0; i < kRows; ++i) {
    for (int64_t n = 0; n < kM; ++n) _mm512_storeu_ps(acc + i * kD + n * kVec, a[i][n]);
  }
}
#else
constexpr bool kHasBf16Dot = false;
// Declared only, so that attend_block's discarded bf16 branch names something.
template <int64_t kD, typename kvT>
void pack_block_bf16(const KvRows<kvT>&, const int64_t*, int64_t, uint32_t*, uint32_t*);
template <int64_t kD, int64_t kRows>
void block_attend_bf16(const uint32_t*, const uint32_t*, const uint32_t*, float, const int64_t*,
                       const int64_t*, int64_t, int64_t, float*, float*, float*);
#endif

template <int64_t kD, typename qT, typename kvT>
void attend_block(const qT* q, int64_t q_row_stride, qT* out, const KvRows<kvT>& kv,
                  const int64_t* slots, int64_t seq_len, int64_t q_len, int64_t row0,
                  int64_t nrows, int64_t kv_head, int64_t num_heads, int64_t num_kv_heads,
                  float scale, int64_t window, BlockScratch& s) {
  static_assert(kD % kVec == 0, "the blocked kernel needs a head dim of whole vectors");
  // bf16 queries and K/V (bf16, or quantized and converted to bf16 as a block is
  // packed), or float queries over K/V stored in bf16 (--kv-cache-dtype bfloat16: the
  // queries rounded to bf16, as llama.cpp rounds them to its KV cache's f16) on a CPU
  // with bf16 dot products: the pairs path.
  constexpr bool kPairs =
      kHasBf16Dot &&
      ((std::is_same_v<qT, c10::BFloat16> && (std::is_same_v<kvT, c10::BFloat16> || kQuantized<kvT>)) ||
       (std::is_same_v<qT, float> && std::is_same_v<kvT, c10::BFloat16>));
  // Score rows at a time: as many as keep the accumulators in registers. AVX-512
  // (32 registers) at head dim 64: 6 rows x 4 vectors of scores or values and 4 of
  // the key or value block's (bf16 pairs: 4 rows). AVX2 (16 registers of 8 floats,
  // 4 vectors a pass): 3 rows x 4, the block's vectors as memory operands (3 rows:
  // 1.0-1.15x of 2, 4 rows spill).
  constexpr int64_t kPair =
      kVectorRegisters >= 32 ? (kD <= 64 ? (kPairs ? 4 : 6) : 2) : 3;
  const int64_t group = num_heads / num_kv_heads;
  const int64_t rows = nrows * group;  // score rows: (query row i, head g) at i * group + g
  const int64_t first_pos = seq_len - q_len + row0;  // position of query row row0
  const int64_t num_keys = first_pos + nrows;  // keys any row of the task sees end here
  const int64_t key0 = first_key(first_pos, window);  // and start here
  const int64_t padded = (rows + kPair - 1) / kPair * kPair;
  s.acc.assign(padded * kD, 0.0f);
  s.m.assign(padded, -std::numeric_limits<float>::infinity());
  s.l.assign(padded, 0.0f);
  if constexpr (kPairs) {
    s.q2.assign(padded * kD / 2, 0);
    s.k2.resize(kD / 2 * kKBlock);
    s.v2.resize(kKBlock / 2 * kD);
  } else {
    s.qf.assign(padded * kD, 0.0f);
    s.kt.resize(kD * kKBlock);
    s.vb.resize(kKBlock * kD);
  }
  for (int64_t i = 0; i < nrows; ++i) {
    for (int64_t g = 0; g < group; ++g) {
      const qT* src = q + (row0 + i) * q_row_stride + (kv_head * group + g) * kD;
      const int64_t r = i * group + g;
      if constexpr (kPairs && kRotated<kvT>) {  // rotated, then rounded to bf16 again
        float rotated[kD];
        for (int64_t d = 0; d < kD; ++d) rotated[d] = to_float(src[d]);
        rotate_rows<kvT>(rotated, 1, kD);
        auto* dst = reinterpret_cast<uint16_t*>(s.q2.data() + r * kD / 2);
        for (int64_t d = 0; d < kD; ++d) dst[d] = c10::BFloat16(rotated[d]).x;
      } else if constexpr (kPairs && std::is_same_v<qT, c10::BFloat16>) {
        std::memcpy(s.q2.data() + r * kD / 2, src, kD * sizeof(qT));
      } else if constexpr (kPairs) {
        auto* dst = reinterpret_cast<uint16_t*>(s.q2.data() + r * kD / 2);
        for (int64_t d = 0; d < kD; ++d) dst[d] = c10::BFloat16(to_float(src[d])).x;
      } else {
        for (int64_t d = 0; d < kD; ++d) s.qf[r * kD + d] = to_float(src[d]) * scale;
      }
    }
  }
  if constexpr (!kPairs) rotate_rows<kvT>(s.qf.data(), rows, kD);  // into an int8 pool's basis
  float* kt = s.kt.data();
  float* vb = s.vb.data();
  float score[kPair][kKBlock];
  float correction[kPair];
  for (int64_t kb = key0; kb < num_keys; kb += kKBlock) {
    const int64_t nk = std::min(kKBlock, num_keys - kb);
    if constexpr (kPairs) {
      pack_block_bf16<kD>(kv, slots + kb, nk, s.k2.data(), s.v2.data());
    } else {
      float key[kD], value[kD];
      for (int64_t j = 0; j < nk; ++j) {
        row_to_float(kv.key(slots[kb + j]), kD, key);
        row_to_float(kv.value(slots[kb + j]), kD, value);
        for (int64_t d = 0; d < kD; ++d) kt[d * kKBlock + j] = key[d];
        std::memcpy(vb + j * kD, value, sizeof(value));
      }
      for (int64_t j = nk; j < kKBlock; ++j) {
        for (int64_t d = 0; d < kD; ++d) kt[d * kKBlock + j] = 0.0f;
        for (int64_t d = 0; d < kD; ++d) vb[j * kD + d] = 0.0f;
      }
    }
    // The next block's rows, scattered in the pool, arrive while this one is used.
    for (int64_t j = kb + kKBlock; j < std::min(num_keys, kb + 2 * kKBlock); ++j) {
      prefetch_row(kv.key(slots[j]), kv.row_elems);
      prefetch_row(kv.value(slots[j]), kv.row_elems);
    }
    for (int64_t r = 0; r < padded; r += kPair) {
      // Keys from[i] .. to[i] of the block row r + i sees (rows past `rows` are
      // padding: none); least .. most: those any of them sees.
      int64_t from[kPair], to[kPair], least = kKBlock, most = 0;
      for (int64_t i = 0; i < kPair; ++i) {
        from[i] = to[i] = 0;
        if (r + i >= rows) continue;
        const int64_t pos = first_pos + (r + i) / group;
        to[i] = std::clamp<int64_t>(pos + 1 - kb, 0, nk);
        from[i] = std::clamp<int64_t>(first_key(pos, window) - kb, 0, to[i]);
        if (from[i] < to[i]) {
          least = std::min(least, from[i]);
          most = std::max(most, to[i]);
        }
      }
      if (most == 0) continue;  // the block lies outside these rows' keys
      if constexpr (kPairs) {
        block_attend_bf16<kD, kPair>(s.q2.data() + r * kD / 2, s.k2.data(), s.v2.data(), scale,
                                     from, to, least, most, s.m.data() + r, s.l.data() + r,
                                     s.acc.data() + r * kD);
        continue;
      }
      block_scores<kD, kPair>(s.qf.data() + r * kD, kt, score);
      for (int64_t i = 0; i < kPair; ++i) {
        float* sc = score[i];
        if (to[i] <= from[i]) {  // nothing new for this row: keep its state
          correction[i] = 1.0f;
          for (int64_t j = 0; j < kKBlock; ++j) sc[j] = 0.0f;
          continue;
        }
        const float mx = std::max(s.m[r + i], block_row_max(sc, from[i], to[i]));
        correction[i] = exp_of(s.m[r + i] - mx);  // 0 on the row's first block (m = -inf)
        for (int64_t j0 = 0; j0 < kKBlock; j0 += kBVec) {
          const bvec e = exp_of(loadb(sc + j0) - mx);
          const bvec_i lane = lane_index();
          storeb(sc + j0, (lane < static_cast<int32_t>(to[i] - j0)) &
                                  (lane >= static_cast<int32_t>(from[i] - j0))
                              ? e
                              : bvec{});
        }
        s.l[r + i] = s.l[r + i] * correction[i] + lane_sum(sc, kKBlock);
        s.m[r + i] = mx;
      }
      block_values<kD, kPair>(s.acc.data() + r * kD, score, correction, vb, least, most);
    }
  }
  rotate_rows<kvT>(s.acc.data(), rows, kD);  // out of an int8 pool's basis
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = r / group, g = r % group;
    qT* dst = out + ((row0 + i) * num_heads + kv_head * group + g) * kD;
    const float* a = s.acc.data() + r * kD;
    const float inv = 1.0f / s.l[r];
    for (int64_t d = 0; d < kD; ++d) dst[d] = static_cast<qT>(a[d] * inv);
  }
}
