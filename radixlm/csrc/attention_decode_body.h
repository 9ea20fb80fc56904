// Paged attention's row-wise path (an ISA body fragment, included by
// attention_body.h): decodes and extends of up to kRowwiseMaxRows rows, one
// (request, KV head) task streaming its keys once for every query row of the
// group, then its values once.

// One (request, KV head) task. q rows of the request: [q_len, H, D] at q, rows
// q_row_stride elements apart; out: [q_len, H, D] contiguous. Query row i sits
// at position prefix + i and attends keys first_key(prefix + i, window) .. prefix + i
// (causal within the new rows); keys no row sees are not read. Each key and value
// row is converted to float once, into kv_row, and then used by every query row
// of the group. Head dims of whole vectors (64, 128) take attend_group_vec instead.
template <typename qT, typename kvT>
void attend_group(const qT* q, int64_t q_row_stride, qT* out, const KvRows<kvT>& kv,
                  const int64_t* slots, int64_t seq_len, int64_t q_len, int64_t kv_head,
                  int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float scale,
                  int64_t window, std::vector<float>& qf, std::vector<float>& scores,
                  std::vector<float>& acc) {
  const int64_t group = num_heads / num_kv_heads;
  const int64_t rows = q_len * group;  // (query row, head of the group) pairs
  const int64_t prefix = seq_len - q_len;
  const int64_t base = first_key(prefix, window);  // the first key any row sees
  const int64_t n = seq_len - base;                // keys read; score j - base of a row
  qf.resize(rows * head_dim + head_dim);  // the last head_dim floats: kv_row
  scores.resize(rows * n);
  acc.assign(rows * head_dim, 0.0f);
  float* kv_row = qf.data() + rows * head_dim;
  for (int64_t i = 0; i < q_len; ++i) {
    for (int64_t g = 0; g < group; ++g) {
      const qT* src = q + i * q_row_stride + (kv_head * group + g) * head_dim;
      float* dst = qf.data() + (i * group + g) * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) dst[d] = to_float(src[d]) * scale;
    }
  }
  rotate_rows<kvT>(qf.data(), rows, head_dim);  // into an int8 pool's basis
  // Score rows [lo, hi) see key j: query rows i with first_key(prefix + i) <= j <= prefix + i.
  const auto seen_by = [&](int64_t j, int64_t& lo, int64_t& hi) {
    lo = std::max<int64_t>(j - prefix, 0) * group;
    hi = window > 0 ? std::min<int64_t>(j - prefix + window, q_len) * group : rows;
  };
  // Scores: each key is read (and converted) once for every row of the group.
  for (int64_t j = base; j < seq_len; ++j) {
    if (j + kPrefetchAhead < seq_len) {
      prefetch_row(kv.key(slots[j + kPrefetchAhead]), kv.row_elems);
    }
    row_to_float(kv.key(slots[j]), head_dim, kv_row);
    int64_t lo, hi;
    seen_by(j, lo, hi);
    for (int64_t r = lo; r < hi; ++r) {
      scores[r * n + j - base] = dot(qf.data() + r * head_dim, kv_row, head_dim);
    }
  }
  // Softmax per row over its visible keys, in place.
  for (int64_t i = 0; i < q_len; ++i) {
    const int64_t from = first_key(prefix + i, window) - base, to = prefix + i + 1 - base;
    for (int64_t g = 0; g < group; ++g) {
      float* s = scores.data() + (i * group + g) * n;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = from; j < to; ++j) m = std::max(m, s[j]);
      for (int64_t j = from; j < to; ++j) s[j] = exp_of(s[j] - m);
      const float inv = 1.0f / lane_sum(s + from, to - from);
      for (int64_t j = from; j < to; ++j) s[j] *= inv;
    }
  }
  // Weighted values: each value row is read (and converted) once.
  for (int64_t j = base; j < seq_len; ++j) {
    if (j + kPrefetchAhead < seq_len) {
      prefetch_row(kv.value(slots[j + kPrefetchAhead]), kv.row_elems);
    }
    row_to_float(kv.value(slots[j]), head_dim, kv_row);
    int64_t lo, hi;
    seen_by(j, lo, hi);
    for (int64_t r = lo; r < hi; ++r) {
      const float p = scores[r * n + j - base];
      float* a = acc.data() + r * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) a[d] += p * kv_row[d];
    }
  }
  rotate_rows<kvT>(acc.data(), rows, head_dim);  // out of an int8 pool's basis
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = r / group, g = r % group;
    qT* dst = out + (i * num_heads + kv_head * group + g) * head_dim;
    const float* a = acc.data() + r * head_dim;
    for (int64_t d = 0; d < head_dim; ++d) dst[d] = static_cast<qT>(a[d]);
  }
}

// Lane i of the result: the sum of the lanes of the vector for key i, given the
// kBVec vectors in bit-reversed key order (v[j] holds key bitrev(j)): log2(kBVec)
// rounds of shuffles and adds for kBVec keys, where one sum at a time took as many
// rounds per key.
inline int64_t bitrev(int64_t i) {
  if constexpr (kBVec == 16) {
    return ((i & 1) << 3) | ((i & 2) << 1) | ((i & 4) >> 1) | ((i & 8) >> 3);
  } else {
    return ((i & 1) << 2) | (i & 2) | ((i & 4) >> 2);
  }
}

inline bvec sum_lanes(const bvec* v) {
#if RADIXLM_ISA_AVX512
  bvec a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i) {
    a[i] = __builtin_shufflevector(v[2 * i], v[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18,
                                   19, 20, 21, 22, 23) +
           __builtin_shufflevector(v[2 * i], v[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25,
                                   26, 27, 28, 29, 30, 31);
  }
  for (int i = 0; i < 4; ++i) {
    b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10,
                                   11, 24, 25, 26, 27) +
           __builtin_shufflevector(a[2 * i], a[2 * i + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14,
                                   15, 28, 29, 30, 31);
  }
  for (int i = 0; i < 2; ++i) {
    c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24,
                                   25, 12, 13, 28, 29) +
           __builtin_shufflevector(b[2 * i], b[2 * i + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26,
                                   27, 14, 15, 30, 31);
  }
  return __builtin_shufflevector(c[0], c[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28,
                                 14, 30) +
         __builtin_shufflevector(c[0], c[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29,
                                 15, 31);
#else
  bvec a[4], b[2];
  for (int i = 0; i < 4; ++i) {
    a[i] = __builtin_shufflevector(v[2 * i], v[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
           __builtin_shufflevector(v[2 * i], v[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  }
  for (int i = 0; i < 2; ++i) {
    b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
           __builtin_shufflevector(a[2 * i], a[2 * i + 1], 2, 3, 10, 11, 6, 7, 14, 15);
  }
  return __builtin_shufflevector(b[0], b[1], 0, 8, 2, 10, 4, 12, 6, 14) +
         __builtin_shufflevector(b[0], b[1], 1, 9, 3, 11, 5, 13, 7, 15);
#endif
}

// s[0 .. n) <- exp(s[j] - m), kBVec at a time.
inline void exp_row(float* s, int64_t n, float m) {
  int64_t j = 0;
  for (; j + kBVec <= n; j += kBVec) storeb(s + j, exp_of(loadb(s + j) - m));
  if (j < n) {
    float tail[kBVec] = {};
    std::memcpy(tail, s + j, (n - j) * sizeof(float));
    const bvec e = exp_of(loadb(tail) - m);
    std::memcpy(s + j, &e, (n - j) * sizeof(float));
  }
}

// attend_group_vec's decode task (one query per request) over a quantized pool when
// a pass takes fewer score rows than the group has (AVX2: one row at a time): the
// keys, then the values, are converted kTile rows at a time into a float tile that
// stays in L1, which every row of the group then reads, instead of each row
// converting every key and value again (a group of 4 rows made an int8 pool's
// conversions 4x). Dot products and sums in attend_group_vec's order: the same bits.
template <int64_t kD, typename kvT>
void convert_tile(const KvRows<kvT>& kv, const int64_t* slots, int64_t j0, int64_t nj,
                  int64_t seq_len, bool keys, float* tile) {
  constexpr int64_t kN = kD / kBVec;
  for (int64_t jj = 0; jj < nj; ++jj) {
    const int64_t j = j0 + jj;
    if (j + kPrefetchAhead < seq_len) {
      const int64_t ahead = slots[j + kPrefetchAhead];
      prefetch_row(keys ? kv.key(ahead) : kv.value(ahead), kv.row_elems);
    }
    bvec v[kN];
    load_row<kD>(keys ? kv.key(slots[j]) : kv.value(slots[j]), v);
    for (int64_t n = 0; n < kN; ++n) storeb(tile + jj * kD + n * kBVec, v[n]);
  }
}

template <int64_t kD, typename qT, typename kvT>
void attend_decode_tiled(const qT* q, qT* out, const KvRows<kvT>& kv, const int64_t* slots,
                         int64_t seq_len, int64_t kv_head, int64_t group, float scale,
                         int64_t window, std::vector<float>& qf, std::vector<float>& scores) {
  constexpr int64_t kN = kD / kBVec;
  constexpr int64_t kTile = 4 * kBVec;  // keys a tile: 8 KB of floats at head dim 64 (AVX2)
  const int64_t base = first_key(seq_len - 1, window);
  const int64_t width = seq_len - base;
  alignas(64) float tile[kTile * kD];
  qf.assign(group * kD, 0.0f);
  scores.assign(group * width, 0.0f);
  for (int64_t g = 0; g < group; ++g) {
    const qT* src = q + (kv_head * group + g) * kD;
    for (int64_t d = 0; d < kD; ++d) qf[g * kD + d] = to_float(src[d]) * scale;
  }
  rotate_rows<kvT>(qf.data(), group, kD);  // into an int8 pool's basis
  for (int64_t j0 = base; j0 < seq_len; j0 += kTile) {
    const int64_t nt = std::min(kTile, seq_len - j0);
    convert_tile<kD>(kv, slots, j0, nt, seq_len, true, tile);
    for (int64_t g = 0; g < group; ++g) {
      bvec qv[kN];
      for (int64_t n = 0; n < kN; ++n) qv[n] = loadb(qf.data() + g * kD + n * kBVec);
      for (int64_t b0 = 0; b0 < nt; b0 += kBVec) {
        const int64_t nj = std::min(kBVec, nt - b0);
        bvec partial[kBVec];
        for (int64_t jj = 0; jj < kBVec; ++jj) {
          const int64_t slot = bitrev(jj);
          if (jj >= nj) {
            partial[slot] = bvec{};
            continue;
          }
          const float* k = tile + (b0 + jj) * kD;
          bvec p = qv[0] * loadb(k);
          for (int64_t n = 1; n < kN; ++n) p += qv[n] * loadb(k + n * kBVec);
          partial[slot] = p;
        }
        float lanes[kBVec];
        storeb(lanes, sum_lanes(partial));
        std::memcpy(scores.data() + g * width + (j0 + b0 - base), lanes, nj * sizeof(float));
      }
    }
  }
  for (int64_t g = 0; g < group; ++g) {  // softmax over the row's keys (all visible)
    float* s = scores.data() + g * width;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < width; ++j) m = std::max(m, s[j]);
    exp_row(s, width, m);
    const float inv = 1.0f / lane_sum(s, width);
    for (int64_t j = 0; j < width; ++j) s[j] *= inv;
  }
  qf.assign(group * kD, 0.0f);  // now the value accumulators
  for (int64_t j0 = base; j0 < seq_len; j0 += kTile) {
    const int64_t nt = std::min(kTile, seq_len - j0);
    convert_tile<kD>(kv, slots, j0, nt, seq_len, false, tile);
    for (int64_t g = 0; g < group; ++g) {
      bvec acc[kN];
      for (int64_t n = 0; n < kN; ++n) acc[n] = loadb(qf.data() + g * kD + n * kBVec);
      const float* p = scores.data() + g * width + (j0 - base);
      for (int64_t jj = 0; jj < nt; ++jj) {
        for (int64_t n = 0; n < kN; ++n) acc[n] += p[jj] * loadb(tile + jj * kD + n * kBVec);
      }
      for (int64_t n = 0; n < kN; ++n) storeb(qf.data() + g * kD + n * kBVec, acc[n]);
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    float* a = qf.data() + g * kD;
    rotate_rows<kvT>(a, 1, kD);  // out of an int8 pool's basis
    qT* dst = out + (kv_head * group + g) * kD;
    for (int64_t d = 0; d < kD; ++d) dst[d] = static_cast<qT>(a[d]);
  }
}

// attend_group for head dims of whole vectors (64, 128): the same task, computed
// kRows score rows at a time with the query rows, the running dot products and
// the value accumulators in vector registers; scores of kBVec keys are summed
// together (sum_lanes). Keys a row does not see get probability 0. AVX2 (16
// registers) takes one row at a time: a row's query and value accumulators fill
// half of them, the key and value rows come in as the FMAs' memory operands.
template <int64_t kD, typename qT, typename kvT>
void attend_group_vec(const qT* q, int64_t q_row_stride, qT* out, const KvRows<kvT>& kv,
                      const int64_t* slots, int64_t seq_len, int64_t q_len, int64_t kv_head,
                      int64_t num_heads, int64_t num_kv_heads, int64_t, float scale,
                      int64_t window, std::vector<float>& qf, std::vector<float>& scores,
                      std::vector<float>&) {
  constexpr int64_t kN = kD / kBVec;
  constexpr int64_t kRows = kVectorRegisters >= 32 ? 4 : 1;
  const int64_t group = num_heads / num_kv_heads;
  if constexpr (kQuantized<kvT>) {
    if (q_len == 1 && group > kRows) {
      return attend_decode_tiled<kD>(q, out, kv, slots, seq_len, kv_head, group, scale, window,
                                     qf, scores);
    }
  }
  const int64_t rows = q_len * group;
  const int64_t padded = (rows + kRows - 1) / kRows * kRows;
  const int64_t prefix = seq_len - q_len;
  const int64_t base = first_key(prefix, window);  // the first key any row sees
  const int64_t width = seq_len - base;  // a row's scores: keys base .. seq_len
  qf.assign(padded * kD, 0.0f);
  scores.assign(padded * width, 0.0f);
  for (int64_t i = 0; i < q_len; ++i) {
    for (int64_t g = 0; g < group; ++g) {
      const qT* src = q + i * q_row_stride + (kv_head * group + g) * kD;
      float* dst = qf.data() + (i * group + g) * kD;
      for (int64_t d = 0; d < kD; ++d) dst[d] = to_float(src[d]) * scale;
    }
  }
  rotate_rows<kvT>(qf.data(), rows, kD);  // into an int8 pool's basis
  // Score row r (r < rows) sees keys [lo(r), hi(r)); rows r0 .. r0 + kRows together
  // read [lo(r0), hi(last real row of them)).
  const auto lo = [&](int64_t r) { return first_key(prefix + r / group, window); };
  const auto hi = [&](int64_t r) { return prefix + r / group + 1; };
  const auto hi_of_rows = [&](int64_t r0) { return hi(std::min(r0 + kRows, rows) - 1); };
  for (int64_t r0 = 0; r0 < padded; r0 += kRows) {
    const int64_t first = lo(r0), last = hi_of_rows(r0);
    bvec qv[kRows][kN];
    for (int64_t i = 0; i < kRows; ++i) {
      for (int64_t n = 0; n < kN; ++n) qv[i][n] = loadb(qf.data() + (r0 + i) * kD + n * kBVec);
    }
    for (int64_t j0 = first; j0 < last; j0 += kBVec) {
      const int64_t nj = std::min(kBVec, last - j0);
      bvec partial[kRows][kBVec];
      for (int64_t jj = 0; jj < kBVec; ++jj) {
        const int64_t slot = bitrev(jj);
        if (jj >= nj) {
          for (int64_t i = 0; i < kRows; ++i) partial[i][slot] = bvec{};
          continue;
        }
        const int64_t j = j0 + jj;
        if (j + kPrefetchAhead < seq_len) {
          prefetch_row(kv.key(slots[j + kPrefetchAhead]), kv.row_elems);
        }
        bvec kvv[kN];
        load_row<kD>(kv.key(slots[j]), kvv);
        for (int64_t i = 0; i < kRows; ++i) {
          bvec p = qv[i][0] * kvv[0];
          for (int64_t n = 1; n < kN; ++n) p += qv[i][n] * kvv[n];
          partial[i][slot] = p;
        }
      }
      for (int64_t i = 0; i < kRows; ++i) {
        float lanes[kBVec];
        storeb(lanes, sum_lanes(partial[i]));
        std::memcpy(scores.data() + (r0 + i) * width + (j0 - base), lanes, nj * sizeof(float));
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {  // softmax over each row's visible keys
    float* s = scores.data() + r * width;
    const int64_t from = lo(r) - base, to = hi(r) - base;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = from; j < to; ++j) m = std::max(m, s[j]);
    exp_row(s + from, to - from, m);
    const float inv = 1.0f / lane_sum(s + from, to - from);
    for (int64_t j = 0; j < from; ++j) s[j] = 0.0f;
    for (int64_t j = from; j < to; ++j) s[j] *= inv;
    for (int64_t j = to; j < width; ++j) s[j] = 0.0f;
  }
  for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
    const int64_t first = lo(r0), last = hi_of_rows(r0);
    bvec acc[kRows][kN] = {};
    for (int64_t j = first; j < last; ++j) {
      if (j + kPrefetchAhead < seq_len) {
        prefetch_row(kv.value(slots[j + kPrefetchAhead]), kv.row_elems);
      }
      bvec vv[kN];
      load_row<kD>(kv.value(slots[j]), vv);
      for (int64_t i = 0; i < kRows; ++i) {
        const float p = scores[(r0 + i) * width + j - base];  // 0 for padding rows
        for (int64_t n = 0; n < kN; ++n) acc[i][n] += p * vv[n];
      }
    }
    for (int64_t i = 0; i < kRows && r0 + i < rows; ++i) {
      const int64_t r = r0 + i, qi = r / group, g = r % group;
      float a[kD];
      for (int64_t n = 0; n < kN; ++n) storeb(a + n * kBVec, acc[i][n]);
      rotate_rows<kvT>(a, 1, kD);  // out of an int8 pool's basis
      qT* dst = out + (qi * num_heads + kv_head * group + g) * kD;
      for (int64_t d = 0; d < kD; ++d) dst[d] = static_cast<qT>(a[d]);
    }
  }
}
