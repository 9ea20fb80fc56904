// CPU kernels that no maintained library offers in the shape radixlm needs.
//
// 1. paged_attention: attention over K/V read in place from the paged pool
//    through each request's row of the slot table (no gather copy). Up to 16 new
//    rows a request (a decode's one, a speculative step's 1 + K): each (request,
//    KV head) task streams its keys once, scores every query row of the group
//    against them, then streams the values once. Longer extends (prefill chunks):
//    blocked flash attention, 64 query rows x 64 keys, online softmax.
// 2. int8_linear: W8A8 linear with per-token activation scales: one pass
//    quantizes each row of x to int8, at::_int_mm (oneDNN s8s8 -> s32) does
//    the product, one pass applies both scales (and the bias).
// 3. silu_and_mul, add_rms_norm and rotary_embedding: a decode step's elementwise
//    work in one pass each, and in one thread while the tensor is small. torch runs
//    them as 2, 7 and 7 operators, each a parallel region once it passes 32k
//    elements: on a busy 2-core machine every region can wait a whole time slice
//    for a descheduled thread (12% of a batch-32 step was in silu alone).
// 4. small_batch_linear: a linear layer of 1-2 rows (bfloat16/half), streaming the
//    plain weight once at close to the memory bandwidth.
//
// Plain C++ loops written so the compiler vectorizes them for the CPU it is
// built on (the set-up builds it per machine, -march=native). Where accumulators
// must stay in registers, they are GCC/Clang vector-extension types (bvec, one
// register wide; f32x16), which the compiler maps to the CPU's vectors. One
// exception: on CPUs with AVX512_BF16 the blocked prefill kernel's two products
// over bfloat16 K/V use its bf16 dot-product instruction (vdpbf16ps, two bf16
// products summed into each float lane: twice the fp32 FMA rate), which no
// compiler emits by itself.
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "claim_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#ifdef __AVX512BF16__
#include <immintrin.h>
#endif

namespace {

template <typename T>
inline float to_float(T x) {
  return static_cast<float>(x);
}

// q . k over n elements. Sixteen independent partial sums (one vector register's
// lanes) let the compiler vectorize without reassociating a single running sum.
constexpr int64_t kLanes = 16;

template <typename T>
inline float dot(const float* q, const T* k, int64_t n) {
  float partial[kLanes] = {0.0f};
  int64_t d = 0;
  for (; d + kLanes <= n; d += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) partial[l] += q[d + l] * to_float(k[d + l]);
  }
  // Halve the lanes until one is left: a few vector adds, where a running sum over
  // the lanes was a chain of 15 dependent scalar adds (most of a decode's time).
  float half[kLanes / 2], quarter[kLanes / 4];
  for (int64_t l = 0; l < kLanes / 2; ++l) half[l] = partial[l] + partial[l + kLanes / 2];
  for (int64_t l = 0; l < kLanes / 4; ++l) quarter[l] = half[l] + half[l + kLanes / 4];
  float sum = (quarter[0] + quarter[2]) + (quarter[1] + quarter[3]);
  for (; d < n; ++d) sum += q[d] * to_float(k[d]);
  return sum;
}

// One register of floats (16 with AVX-512, 8 with AVX2): the vectors of the decode
// path (attend_group_vec) and of the float blocked path. f32x16 on AVX2 is two ymm
// each, and its accumulators spilled to the stack there (decode attention at 15
// GF/s, prefill at 7). The blocked path keeps at most kBlockVecs of them in a row's
// accumulators at once, so that kPair rows of accumulators, the block's vectors
// and a broadcast fit the registers.
#ifdef __AVX512F__
constexpr int64_t kBVec = 16;
constexpr int64_t kBlockVecs = 8;
#else
constexpr int64_t kBVec = 8;
constexpr int64_t kBlockVecs = 4;
#endif
typedef float bvec __attribute__((vector_size(kBVec * sizeof(float))));

inline bvec loadb(const float* p) {
  bvec v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void storeb(float* p, bvec v) { std::memcpy(p, &v, sizeof(v)); }

typedef int32_t bvec_i __attribute__((vector_size(kBVec * sizeof(int32_t))));

inline bvec_i lane_index() {  // 0, 1, .., kBVec - 1
  bvec_i v;
  for (int64_t l = 0; l < kBVec; ++l) v[l] = static_cast<int32_t>(l);
  return v;
}

// exp_of's steps that differ between a float and a bvec of them.
inline float clamp88(float x) { return std::min(88.0f, std::max(-88.0f, x)); }
inline bvec clamp88(bvec x) {
  const bvec hi = bvec{} + 88.0f, lo = bvec{} - 88.0f;
  x = x < hi ? x : hi;
  return x > lo ? x : lo;
}
inline int32_t to_int(float x) { return static_cast<int32_t>(x); }
inline bvec_i to_int(bvec x) { return __builtin_convertvector(x, bvec_i); }

// exp(x) for a float or a bvec, in plain arithmetic (std::exp stays a scalar call
// without -ffast-math; scalar loops of this one did not always vectorize, so the
// hot loops call it on bvecs): Cephes' expf, x = n ln2 + r, e^r by its degree-6
// polynomial, times 2^n through the exponent bits. Within 2 ulp of expf on
// [-88, 88]; silu's results are rounded to bfloat16/half after it anyway.
template <typename T>
inline T exp_of(T x) {
  x = clamp88(x);
  const T n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x / ln2)
  const T r = x - n * 0.693359375f + n * 2.12194440e-4f;  // x - n ln2 in two parts
  T p = T{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const auto bits = (to_int(n) + 127) << 23;
  static_assert(sizeof(bits) == sizeof(T), "int lanes as wide as the float lanes");
  T scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// x[0] + ... + x[n-1] in kLanes partial sums (vectorizes; see dot).
inline float lane_sum(const float* x, int64_t n) {
  float partial[kLanes] = {0.0f};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) partial[l] += x[j + l];
  }
  float sum = 0.0f;
  for (int64_t l = 0; l < kLanes; ++l) sum += partial[l];
  for (; j < n; ++j) sum += x[j];
  return sum;
}

// Rows of the pool are scattered (slots come from a free list), so the hardware
// prefetcher cannot follow them: ask for the row a few keys ahead explicitly.
constexpr int64_t kPrefetchAhead = 16;

template <typename T>
inline void prefetch_row(const T* row, int64_t n) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t off = 0; off < n * static_cast<int64_t>(sizeof(T)); off += 64) {
    __builtin_prefetch(p + off, 0, 1);
  }
}

// A vector of 16 floats (GCC/Clang vector extension: the compiler picks the
// instructions for the CPU, one zmm register or two ymm): small_batch_linear's
// accumulators (the attention paths use bvec, one register wide; as float arrays
// accumulators lived on the stack and every FMA waited for the previous store).
// kVec: the bf16 pairs path's lanes (AVX512_BF16 only).
typedef float f32x16 __attribute__((vector_size(64)));
constexpr int64_t kVec = 16;
#ifdef __AVX512F__
constexpr int64_t kVectorRegisters = 32;
#else
constexpr int64_t kVectorRegisters = 16;
#endif

inline f32x16 load16(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store16(float* p, f32x16 v) { std::memcpy(p, &v, sizeof(v)); }

// One (request, KV head) task. q rows of the request: [q_len, H, D] at q, rows
// q_row_stride elements apart; out: [q_len, H, D] contiguous. Query row i sits
// at position prefix + i and attends keys 0 .. prefix + i (causal within the
// new rows). Each key and value row is converted to float once, into kv_row,
// and then used by every query row of the group. Head dims of whole vectors
// (64, 128) take attend_group_vec instead.
template <typename qT, typename kvT>
void attend_group(const qT* q, int64_t q_row_stride, qT* out, const kvT* k_buf,
                  const kvT* v_buf, const int64_t* slots, int64_t seq_len, int64_t q_len,
                  int64_t kv_head, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                  float scale, std::vector<float>& qf, std::vector<float>& scores,
                  std::vector<float>& acc) {
  const int64_t group = num_heads / num_kv_heads;
  const int64_t rows = q_len * group;  // (query row, head of the group) pairs
  const int64_t prefix = seq_len - q_len;
  const int64_t kv_stride = num_kv_heads * head_dim;
  qf.resize(rows * head_dim + head_dim);  // the last head_dim floats: kv_row
  scores.resize(rows * seq_len);
  acc.assign(rows * head_dim, 0.0f);
  float* kv_row = qf.data() + rows * head_dim;
  for (int64_t i = 0; i < q_len; ++i) {
    for (int64_t g = 0; g < group; ++g) {
      const qT* src = q + i * q_row_stride + (kv_head * group + g) * head_dim;
      float* dst = qf.data() + (i * group + g) * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) dst[d] = to_float(src[d]) * scale;
    }
  }
  // Scores: each key is read (and converted) once for every row of the group.
  for (int64_t j = 0; j < seq_len; ++j) {
    if (j + kPrefetchAhead < seq_len) {
      prefetch_row(k_buf + slots[j + kPrefetchAhead] * kv_stride + kv_head * head_dim, head_dim);
    }
    const kvT* key = k_buf + slots[j] * kv_stride + kv_head * head_dim;
    for (int64_t d = 0; d < head_dim; ++d) kv_row[d] = to_float(key[d]);
    const int64_t first = std::max<int64_t>(j - prefix, 0) * group;  // rows that see key j
    for (int64_t r = first; r < rows; ++r) {
      scores[r * seq_len + j] = dot(qf.data() + r * head_dim, kv_row, head_dim);
    }
  }
  // Softmax per row over its visible keys, in place.
  for (int64_t i = 0; i < q_len; ++i) {
    const int64_t visible = prefix + i + 1;
    for (int64_t g = 0; g < group; ++g) {
      float* s = scores.data() + (i * group + g) * seq_len;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < visible; ++j) m = std::max(m, s[j]);
      for (int64_t j = 0; j < visible; ++j) s[j] = exp_of(s[j] - m);
      const float inv = 1.0f / lane_sum(s, visible);
      for (int64_t j = 0; j < visible; ++j) s[j] *= inv;
    }
  }
  // Weighted values: each value row is read (and converted) once.
  for (int64_t j = 0; j < seq_len; ++j) {
    if (j + kPrefetchAhead < seq_len) {
      prefetch_row(v_buf + slots[j + kPrefetchAhead] * kv_stride + kv_head * head_dim, head_dim);
    }
    const kvT* value = v_buf + slots[j] * kv_stride + kv_head * head_dim;
    for (int64_t d = 0; d < head_dim; ++d) kv_row[d] = to_float(value[d]);
    const int64_t first = std::max<int64_t>(j - prefix, 0) * group;
    for (int64_t r = first; r < rows; ++r) {
      const float p = scores[r * seq_len + j];
      float* a = acc.data() + r * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) a[d] += p * kv_row[d];
    }
  }
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
#ifdef __AVX512F__
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

template <int64_t kD, typename kvT>
inline void load_row(const kvT* row, bvec (&out)[kD / kBVec]) {
  if constexpr (std::is_same_v<kvT, float>) {
    for (int64_t n = 0; n < kD / kBVec; ++n) out[n] = loadb(row + n * kBVec);
  } else {
    float tmp[kD];
    for (int64_t d = 0; d < kD; ++d) tmp[d] = to_float(row[d]);
    for (int64_t n = 0; n < kD / kBVec; ++n) out[n] = loadb(tmp + n * kBVec);
  }
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

// attend_group for head dims of whole vectors (64, 128): the same task, computed
// kRows score rows at a time with the query rows, the running dot products and
// the value accumulators in vector registers; scores of kBVec keys are summed
// together (sum_lanes). Keys a row does not see get probability 0. AVX2 (16
// registers) takes one row at a time: a row's query and value accumulators fill
// half of them, the key and value rows come in as the FMAs' memory operands.
template <int64_t kD, typename qT, typename kvT>
void attend_group_vec(const qT* q, int64_t q_row_stride, qT* out, const kvT* k_buf,
                      const kvT* v_buf, const int64_t* slots, int64_t seq_len, int64_t q_len,
                      int64_t kv_head, int64_t num_heads, int64_t num_kv_heads, int64_t,
                      float scale, std::vector<float>& qf, std::vector<float>& scores,
                      std::vector<float>&) {
  constexpr int64_t kN = kD / kBVec;
  constexpr int64_t kRows = kVectorRegisters >= 32 ? 4 : 1;
  const int64_t group = num_heads / num_kv_heads;
  const int64_t rows = q_len * group;
  const int64_t padded = (rows + kRows - 1) / kRows * kRows;
  const int64_t prefix = seq_len - q_len;
  const int64_t kv_stride = num_kv_heads * kD;
  qf.assign(padded * kD, 0.0f);
  scores.assign(padded * seq_len, 0.0f);
  for (int64_t i = 0; i < q_len; ++i) {
    for (int64_t g = 0; g < group; ++g) {
      const qT* src = q + i * q_row_stride + (kv_head * group + g) * kD;
      float* dst = qf.data() + (i * group + g) * kD;
      for (int64_t d = 0; d < kD; ++d) dst[d] = to_float(src[d]) * scale;
    }
  }
  const auto visible = [&](int64_t r) { return r < rows ? prefix + r / group + 1 : 0; };
  for (int64_t r0 = 0; r0 < padded; r0 += kRows) {
    const int64_t last = std::min(seq_len, visible(std::min(r0 + kRows, rows) - 1));
    bvec qv[kRows][kN];
    for (int64_t i = 0; i < kRows; ++i) {
      for (int64_t n = 0; n < kN; ++n) qv[i][n] = loadb(qf.data() + (r0 + i) * kD + n * kBVec);
    }
    for (int64_t j0 = 0; j0 < last; j0 += kBVec) {
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
          prefetch_row(k_buf + slots[j + kPrefetchAhead] * kv_stride + kv_head * kD, kD);
        }
        bvec kv[kN];
        load_row<kD>(k_buf + slots[j] * kv_stride + kv_head * kD, kv);
        for (int64_t i = 0; i < kRows; ++i) {
          bvec p = qv[i][0] * kv[0];
          for (int64_t n = 1; n < kN; ++n) p += qv[i][n] * kv[n];
          partial[i][slot] = p;
        }
      }
      for (int64_t i = 0; i < kRows; ++i) {
        float lanes[kBVec];
        storeb(lanes, sum_lanes(partial[i]));
        std::memcpy(scores.data() + (r0 + i) * seq_len + j0, lanes, nj * sizeof(float));
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {  // softmax over each row's visible keys
    float* s = scores.data() + r * seq_len;
    const int64_t vis = visible(r);
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < vis; ++j) m = std::max(m, s[j]);
    exp_row(s, vis, m);
    const float inv = 1.0f / lane_sum(s, vis);
    for (int64_t j = 0; j < vis; ++j) s[j] *= inv;
    for (int64_t j = vis; j < seq_len; ++j) s[j] = 0.0f;
  }
  for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
    const int64_t last = std::min(seq_len, visible(std::min(r0 + kRows, rows) - 1));
    bvec acc[kRows][kN] = {};
    for (int64_t j = 0; j < last; ++j) {
      if (j + kPrefetchAhead < seq_len) {
        prefetch_row(v_buf + slots[j + kPrefetchAhead] * kv_stride + kv_head * kD, kD);
      }
      bvec vv[kN];
      load_row<kD>(v_buf + slots[j] * kv_stride + kv_head * kD, vv);
      for (int64_t i = 0; i < kRows; ++i) {
        const float p = scores[(r0 + i) * seq_len + j];  // 0 for padding rows
        for (int64_t n = 0; n < kN; ++n) acc[i][n] += p * vv[n];
      }
    }
    for (int64_t i = 0; i < kRows && r0 + i < rows; ++i) {
      const int64_t r = r0 + i, qi = r / group, g = r % group;
      float a[kD];
      for (int64_t n = 0; n < kN; ++n) storeb(a + n * kBVec, acc[i][n]);
      qT* dst = out + (qi * num_heads + kv_head * group + g) * kD;
      for (int64_t d = 0; d < kD; ++d) dst[d] = static_cast<qT>(a[d]);
    }
  }
}

// Long extends (prefill chunks): flash attention over the pool in blocks. A task
// is kQBlock query rows of one request and one KV head (with the group's heads:
// rows x group score rows). Keys come kKBlock at a time; each block is converted
// once into float scratch, K transposed ([D][kKBlock], so the scores of a row
// vectorize over keys without a horizontal sum) and V as it is ([kKBlock][D]),
// and then serves every score row of the task. The softmax is online (running
// max and sum per row, the accumulator rescaled when the max grows), so scratch
// does not grow with the sequence; blocks past a row's position are skipped.
constexpr int64_t kRowwiseMaxRows = 16;  // extends up to this use attend_group
constexpr int64_t kQBlock = 64;
constexpr int64_t kKBlock = 64;

struct BlockScratch {
  std::vector<float> qf, kt, vb, acc, m, l;
  std::vector<uint32_t> q2, k2, v2;  // the bf16 path's pairs (see block_attend_bf16)
};


// max(x[0 .. n)) for n <= kKBlock, -inf for n = 0: lane-wise over the block, where
// a loop of std::max stays a chain of scalar compares (12% of a prefill's time).
inline float block_row_max(const float* x, int64_t n) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float partial[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) partial[l] = kNegInf;
  for (int64_t j0 = 0; j0 < kKBlock; j0 += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) {
      const float v = j0 + l < n ? x[j0 + l] : kNegInf;
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

// acc_i <- acc_i * correction_i + sum_j p_i[j] v_j for rows i < kRows (p zero past
// `visible`), vb the block's values ([kKBlock][kD]); dims kN vectors at a time.
template <int64_t kD, int64_t kRows>
inline void block_values(float* acc, const float (*p)[kKBlock], const float* correction,
                         const float* vb, int64_t visible) {
  constexpr int64_t kN = std::min(kD / kBVec, kBlockVecs);
  for (int64_t d0 = 0; d0 < kD; d0 += kN * kBVec) {
    bvec a[kRows][kN];
    for (int64_t i = 0; i < kRows; ++i) {
      for (int64_t n = 0; n < kN; ++n) {
        a[i][n] = loadb(acc + i * kD + d0 + n * kBVec) * correction[i];
      }
    }
    for (int64_t j = 0; j < visible; ++j) {
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

#ifdef __AVX512BF16__
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

template <int64_t kD>
inline void pack_block_bf16(const c10::BFloat16* k_buf, const c10::BFloat16* v_buf,
                            const int64_t* slots, int64_t nk, int64_t kv_stride, int64_t head,
                            uint32_t* k2, uint32_t* v2) {
  for (int64_t j = 0; j < kKBlock; ++j) {
    const c10::BFloat16* key = k_buf + slots[std::min(j, nk - 1)] * kv_stride + head * kD;
    for (int64_t p = 0; p < kD / 2; ++p) k2[p * kKBlock + j] = j < nk ? bf16_pair(key + 2 * p) : 0;
  }
  uint16_t even[kD], odd[kD];
  for (int64_t j = 0; j < kKBlock; j += 2) {
    for (int64_t t = 0; t < 2; ++t) {
      uint16_t* dst = t == 0 ? even : odd;
      if (j + t < nk) {
        std::memcpy(dst, v_buf + slots[j + t] * kv_stride + head * kD, sizeof(even));
      } else {
        std::memset(dst, 0, sizeof(even));
      }
    }
    uint32_t* row = v2 + (j / 2) * kD;
    for (int64_t d = 0; d < kD; ++d) row[d] = uint32_t(even[d]) | uint32_t(odd[d]) << 16;
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

// Lanes 16 n .. 16 n + 15 of a block row that sees `visible` keys.
inline __mmask16 visible_lanes(int64_t visible, int64_t n) {
  const int64_t k = std::clamp<int64_t>(visible - n * kVec, 0, kVec);
  return static_cast<__mmask16>((1u << k) - 1u);
}

// One key block for kRows score rows, in registers from the scores to the values:
// s = scale * q . k (q2: [kRows][kD / 2] pairs), the online softmax update of m
// and l, p rounded to bf16 pairs, acc <- acc * correction + p V. Rows that see
// none of the block keep their state.
template <int64_t kD, int64_t kRows>
inline void block_attend_bf16(const uint32_t* q2, const uint32_t* k2, const uint32_t* v2,
                              float scale, const int64_t* visible, int64_t most, float* m,
                              float* l, float* acc) {
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
    if (visible[i] == 0) {
      correction[i] = 1.0f;
      std::memset(p2[i], 0, sizeof(p2[i]));
      continue;
    }
    __m512 mx = neg_inf;
    for (int64_t n = 0; n < kN; ++n) {
      sc[i][n] = _mm512_mask_mul_ps(neg_inf, visible_lanes(visible[i], n), sc[i][n],
                                    _mm512_set1_ps(scale));
      mx = _mm512_max_ps(mx, sc[i][n]);
    }
    const float new_max = std::max(m[i], _mm512_reduce_max_ps(mx));
    correction[i] = std::exp(m[i] - new_max);  // 0 on the row's first block (m = -inf)
    __m512 sum = _mm512_setzero_ps();
    for (int64_t n = 0; n < kN; ++n) {
      sc[i][n] = _mm512_maskz_mov_ps(visible_lanes(visible[i], n),
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
  for (int64_t jp = 0; jp < (most + 1) / 2; ++jp) {
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
template <int64_t kD>
void pack_block_bf16(const c10::BFloat16*, const c10::BFloat16*, const int64_t*, int64_t, int64_t,
                     int64_t, uint32_t*, uint32_t*);
template <int64_t kD, int64_t kRows>
void block_attend_bf16(const uint32_t*, const uint32_t*, const uint32_t*, float, const int64_t*,
                       int64_t, float*, float*, float*);
#endif

template <int64_t kD, typename qT, typename kvT>
void attend_block(const qT* q, int64_t q_row_stride, qT* out, const kvT* k_buf, const kvT* v_buf,
                  const int64_t* slots, int64_t seq_len, int64_t q_len, int64_t row0,
                  int64_t nrows, int64_t kv_head, int64_t num_heads, int64_t num_kv_heads,
                  float scale, BlockScratch& s) {
  static_assert(kD % kVec == 0, "the blocked kernel needs a head dim of whole vectors");
  // bf16 queries and K/V on a CPU with bf16 dot products: the pairs path.
  constexpr bool kPairs = kHasBf16Dot && std::is_same_v<qT, c10::BFloat16> &&
                          std::is_same_v<kvT, c10::BFloat16>;
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
  const int64_t num_keys = first_pos + nrows;  // keys any row of the task sees
  const int64_t kv_stride = num_kv_heads * kD;
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
      if constexpr (kPairs) {
        std::memcpy(s.q2.data() + r * kD / 2, src, kD * sizeof(qT));
      } else {
        for (int64_t d = 0; d < kD; ++d) s.qf[r * kD + d] = to_float(src[d]) * scale;
      }
    }
  }
  float* kt = s.kt.data();
  float* vb = s.vb.data();
  float score[kPair][kKBlock];
  float correction[kPair];
  for (int64_t kb = 0; kb < num_keys; kb += kKBlock) {
    const int64_t nk = std::min(kKBlock, num_keys - kb);
    if constexpr (kPairs) {
      pack_block_bf16<kD>(k_buf, v_buf, slots + kb, nk, kv_stride, kv_head, s.k2.data(),
                          s.v2.data());
    } else {
      for (int64_t j = 0; j < nk; ++j) {
        const kvT* key = k_buf + slots[kb + j] * kv_stride + kv_head * kD;
        const kvT* value = v_buf + slots[kb + j] * kv_stride + kv_head * kD;
        for (int64_t d = 0; d < kD; ++d) kt[d * kKBlock + j] = to_float(key[d]);
        for (int64_t d = 0; d < kD; ++d) vb[j * kD + d] = to_float(value[d]);
      }
      for (int64_t j = nk; j < kKBlock; ++j) {
        for (int64_t d = 0; d < kD; ++d) kt[d * kKBlock + j] = 0.0f;
        for (int64_t d = 0; d < kD; ++d) vb[j * kD + d] = 0.0f;
      }
    }
    // The next block's rows, scattered in the pool, arrive while this one is used.
    for (int64_t j = kb + kKBlock; j < std::min(num_keys, kb + 2 * kKBlock); ++j) {
      prefetch_row(k_buf + slots[j] * kv_stride + kv_head * kD, kD);
      prefetch_row(v_buf + slots[j] * kv_stride + kv_head * kD, kD);
    }
    for (int64_t r = 0; r < padded; r += kPair) {
      // Keys of the block row r + i sees (rows past `rows` are padding: none).
      int64_t visible[kPair], most = 0;
      for (int64_t i = 0; i < kPair; ++i) {
        visible[i] = r + i < rows
                         ? std::max<int64_t>(std::min(nk, first_pos + (r + i) / group + 1 - kb), 0)
                         : 0;
        most = std::max(most, visible[i]);
      }
      if (most == 0) continue;  // the whole block lies after these rows
      if constexpr (kPairs) {
        block_attend_bf16<kD, kPair>(s.q2.data() + r * kD / 2, s.k2.data(), s.v2.data(), scale,
                                     visible, most, s.m.data() + r, s.l.data() + r,
                                     s.acc.data() + r * kD);
        continue;
      }
      block_scores<kD, kPair>(s.qf.data() + r * kD, kt, score);
      for (int64_t i = 0; i < kPair; ++i) {
        float* sc = score[i];
        const int64_t vis = visible[i];
        float mx = s.m[r + i];
        mx = std::max(mx, block_row_max(sc, vis));
        if (vis == 0) {  // nothing new for this row: keep its state
          correction[i] = 1.0f;
          for (int64_t j = 0; j < kKBlock; ++j) sc[j] = 0.0f;
          continue;
        }
        correction[i] = exp_of(s.m[r + i] - mx);  // 0 on the row's first block (m = -inf)
        for (int64_t j0 = 0; j0 < kKBlock; j0 += kBVec) {
          const bvec e = exp_of(loadb(sc + j0) - mx);
          storeb(sc + j0, lane_index() < static_cast<int32_t>(vis - j0) ? e : bvec{});
        }
        s.l[r + i] = s.l[r + i] * correction[i] + lane_sum(sc, kKBlock);
        s.m[r + i] = mx;
      }
      block_values<kD, kPair>(s.acc.data() + r * kD, score, correction, vb, most);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = r / group, g = r % group;
    qT* dst = out + ((row0 + i) * num_heads + kv_head * group + g) * kD;
    const float* a = s.acc.data() + r * kD;
    const float inv = 1.0f / s.l[r];
    for (int64_t d = 0; d < kD; ++d) dst[d] = static_cast<qT>(a[d] * inv);
  }
}

// One unit of parallel work: request b, KV head h, query rows row0 .. row0 + nrows
// (nrows = 0: all of them, through attend_group).
struct AttnTask {
  int64_t b, h, row0, nrows;
};

// Tasks of the batch, ordered so that contiguous halves cost about the same: a
// request's blocks alternate from its first and last (causal cost grows with the
// row), since claim_parallel starts each thread on one contiguous range.
inline bool has_block_kernel(int64_t head_dim) { return head_dim == 64 || head_dim == 128; }

inline std::vector<AttnTask> attention_tasks(int64_t batch, int64_t num_kv_heads,
                                             int64_t head_dim, const int64_t* qlens) {
  std::vector<AttnTask> tasks;
  for (int64_t b = 0; b < batch; ++b) {
    if (qlens[b] <= kRowwiseMaxRows || !has_block_kernel(head_dim)) {
      for (int64_t h = 0; h < num_kv_heads; ++h) tasks.push_back({b, h, 0, 0});
      continue;
    }
    const int64_t blocks = (qlens[b] + kQBlock - 1) / kQBlock;
    const auto add = [&](int64_t blk) {
      const int64_t row0 = blk * kQBlock;
      for (int64_t h = 0; h < num_kv_heads; ++h) {
        tasks.push_back({b, h, row0, std::min(kQBlock, qlens[b] - row0)});
      }
    };
    for (int64_t lo = 0, hi = blocks - 1; lo <= hi; ++lo, --hi) {
      add(lo);
      if (hi != lo) add(hi);
    }
  }
  return tasks;
}

template <typename qT, typename kvT>
void paged_attention_impl(const at::Tensor& q, at::Tensor& out, const at::Tensor& k_buf,
                          const at::Tensor& v_buf, const at::Tensor& req_to_token,
                          const at::Tensor& req_rows, const at::Tensor& seq_lens,
                          const at::Tensor& q_starts, const at::Tensor& q_lens, double scale) {
  const int64_t batch = req_rows.size(0);
  const int64_t num_heads = q.size(1), head_dim = q.size(2), num_kv_heads = k_buf.size(1);
  const int64_t table_stride = req_to_token.stride(0), q_row_stride = q.stride(0);
  const auto* q_ptr = q.data_ptr<qT>();
  auto* out_ptr = out.data_ptr<qT>();
  const auto* k_ptr = k_buf.data_ptr<kvT>();
  const auto* v_ptr = v_buf.data_ptr<kvT>();
  const auto* table = req_to_token.data_ptr<int64_t>();
  const auto* rows = req_rows.data_ptr<int64_t>();
  const auto* lens = seq_lens.data_ptr<int64_t>();
  const auto* starts = q_starts.data_ptr<int64_t>();
  const auto* qlens = q_lens.data_ptr<int64_t>();
  const std::vector<AttnTask> tasks = attention_tasks(batch, num_kv_heads, head_dim, qlens);
  const auto attend = head_dim == 64    ? &attend_group_vec<64, qT, kvT>
                      : head_dim == 128 ? &attend_group_vec<128, qT, kvT>
                                        : &attend_group<qT, kvT>;
  const auto attend_rows = head_dim == 64 ? &attend_block<64, qT, kvT>
                                          : &attend_block<128, qT, kvT>;
  radixlm::claim_parallel(static_cast<int64_t>(tasks.size()), [&](int64_t t, int64_t) {
    // Each thread's scratch, kept between tasks and calls (grown to the longest).
    thread_local std::vector<float> qf, scores, acc;
    thread_local BlockScratch scratch;
    const AttnTask& task = tasks[t];
    const int64_t b = task.b;
    const qT* q_req = q_ptr + starts[b] * q_row_stride;
    qT* out_req = out_ptr + starts[b] * num_heads * head_dim;
    const int64_t* slots = table + rows[b] * table_stride;
    if (task.nrows == 0) {
      attend(q_req, q_row_stride, out_req, k_ptr, v_ptr, slots, lens[b], qlens[b], task.h,
             num_heads, num_kv_heads, head_dim, static_cast<float>(scale), qf, scores, acc);
    } else {
      attend_rows(q_req, q_row_stride, out_req, k_ptr, v_ptr, slots, lens[b], qlens[b],
                  task.row0, task.nrows, task.h, num_heads, num_kv_heads,
                  static_cast<float>(scale), scratch);
    }
  });
}

template <typename qT>
void dispatch_kv(const at::Tensor& q, at::Tensor& out, const at::Tensor& k_buf,
                 const at::Tensor& v_buf, const at::Tensor& req_to_token,
                 const at::Tensor& req_rows, const at::Tensor& seq_lens,
                 const at::Tensor& q_starts, const at::Tensor& q_lens, double scale) {
  switch (k_buf.scalar_type()) {
    case at::kFloat:
      return paged_attention_impl<qT, float>(q, out, k_buf, v_buf, req_to_token, req_rows,
                                             seq_lens, q_starts, q_lens, scale);
    case at::kBFloat16:
      return paged_attention_impl<qT, c10::BFloat16>(q, out, k_buf, v_buf, req_to_token,
                                                     req_rows, seq_lens, q_starts, q_lens, scale);
    case at::kHalf:
      return paged_attention_impl<qT, c10::Half>(q, out, k_buf, v_buf, req_to_token, req_rows,
                                                 seq_lens, q_starts, q_lens, scale);
    default:
      TORCH_CHECK(false, "paged_attention: unsupported KV dtype ", k_buf.scalar_type());
  }
}

}  // namespace

// q [T, H, D]; k_buf, v_buf [slots, Hkv, D]; req_to_token [R, C] int64;
// req_rows, seq_lens, q_starts, q_lens [B] int64 (CPU). Request b owns query
// rows q_starts[b] .. + q_lens[b], at positions seq_lens[b] - q_lens[b] ..
// seq_lens[b] - 1; its keys are slots req_to_token[req_rows[b], :seq_lens[b]].
// Rows of q not covered by any request are left as they are in `out`.
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                           const at::Tensor& req_to_token, const at::Tensor& req_rows,
                           const at::Tensor& seq_lens, const at::Tensor& q_starts,
                           const at::Tensor& q_lens, double scale) {
  TORCH_CHECK(q.device().is_cpu() && k_buf.device().is_cpu(), "paged_attention runs on the CPU");
  TORCH_CHECK(q.dim() == 3 && k_buf.dim() == 3 && v_buf.sizes() == k_buf.sizes());
  TORCH_CHECK(q.size(2) == k_buf.size(2) && q.size(1) % k_buf.size(1) == 0);
  TORCH_CHECK(k_buf.is_contiguous() && v_buf.is_contiguous() && req_to_token.stride(1) == 1);
  for (const auto* t : {&req_to_token, &req_rows, &seq_lens, &q_starts, &q_lens}) {
    TORCH_CHECK(t->scalar_type() == at::kLong, "paged_attention: index tensors must be int64");
  }
  // Rows may be strided (q is a view of the fused qkv projection); heads and dims may not.
  auto qc = (q.stride(2) == 1 && q.stride(1) == q.size(2)) ? q : q.contiguous();
  auto rows = req_rows.contiguous(), lens = seq_lens.contiguous();
  auto starts = q_starts.contiguous(), qlens = q_lens.contiguous();
  auto out = at::empty(qc.sizes(), qc.options());
  switch (qc.scalar_type()) {
    case at::kFloat:
      dispatch_kv<float>(qc, out, k_buf, v_buf, req_to_token, rows, lens, starts, qlens, scale);
      break;
    case at::kBFloat16:
      dispatch_kv<c10::BFloat16>(qc, out, k_buf, v_buf, req_to_token, rows, lens, starts, qlens,
                                 scale);
      break;
    case at::kHalf:
      dispatch_kv<c10::Half>(qc, out, k_buf, v_buf, req_to_token, rows, lens, starts, qlens,
                             scale);
      break;
    default:
      TORCH_CHECK(false, "paged_attention: unsupported query dtype ", qc.scalar_type());
  }
  return out;
}

namespace {

template <typename T>
void quantize_rows(const T* x, int8_t* xq, float* scales, int64_t m, int64_t k) {
  at::parallel_for(0, m, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* row = x + r * k;
      float amax = 0.0f;
      for (int64_t j = 0; j < k; ++j) amax = std::max(amax, std::fabs(to_float(row[j])));
      const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
      const float inv = 1.0f / scale;
      int8_t* dst = xq + r * k;
      for (int64_t j = 0; j < k; ++j) {
        const float v = std::nearbyint(to_float(row[j]) * inv);
        dst[j] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, v)));
      }
      scales[r] = scale;
    }
  });
}

template <typename T>
void dequantize_rows(const int32_t* acc, const float* x_scales, const float* w_scales,
                     const float* bias, T* out, int64_t m, int64_t n) {
  at::parallel_for(0, m, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float xs = x_scales[r];
      const int32_t* a = acc + r * n;
      T* o = out + r * n;
      for (int64_t j = 0; j < n; ++j) {
        float v = static_cast<float>(a[j]) * xs * w_scales[j];
        if (bias != nullptr) v += bias[j];
        o[j] = static_cast<T>(v);
      }
    }
  });
}

}  // namespace

// Per-token symmetric int8: x [M, K] float/bf16 -> (xq [M, K] int8, scales [M] float32),
// x ~= xq * scales[:, None]. An all-zero row gets scale 1.
std::vector<at::Tensor> quantize_per_token(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2);
  auto xc = x.contiguous();
  const int64_t m = xc.size(0), k = xc.size(1);
  auto xq = at::empty({m, k}, xc.options().dtype(at::kChar));
  auto scales = at::empty({m}, xc.options().dtype(at::kFloat));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, xc.scalar_type(), "quantize", [&] {
    quantize_rows<scalar_t>(xc.data_ptr<scalar_t>(), xq.data_ptr<int8_t>(),
                            scales.data_ptr<float>(), m, k);
  });
  return {xq, scales};
}

// W8A8 linear: x [M, K] (float32 or bf16), w_t [K, N] int8 (a transposed view of
// the [N, K] weight or a contiguous [K, N] one), w_scales [N] float32, bias [N]
// float32 or undefined -> [M, N] in x's dtype.
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& w_t, const at::Tensor& w_scales,
                       const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && w_t.dim() == 2 && x.size(1) == w_t.size(0));
  TORCH_CHECK(w_t.scalar_type() == at::kChar && w_scales.scalar_type() == at::kFloat);
  auto q = quantize_per_token(x);
  auto acc = at::_int_mm(q[0], w_t);  // [M, N] int32
  const int64_t m = acc.size(0), n = acc.size(1);
  auto out = at::empty({m, n}, x.options());
  auto ws = w_scales.contiguous();
  at::Tensor b;
  if (bias.has_value() && bias->defined()) b = bias->to(at::kFloat).contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "dequantize", [&] {
    dequantize_rows<scalar_t>(acc.data_ptr<int32_t>(), q[1].data_ptr<float>(),
                              ws.data_ptr<float>(), b.defined() ? b.data_ptr<float>() : nullptr,
                              out.data_ptr<scalar_t>(), m, n);
  });
  return out;
}

namespace {

// Below this many elements a kernel runs in the calling thread (no parallel region).
constexpr int64_t kSerialElems = 1 << 18;

inline int64_t row_grain(int64_t row_len) {
  return std::max<int64_t>(1, kSerialElems / std::max<int64_t>(row_len, 1));
}


template <typename T>
void silu_and_mul_rows(const T* x, int64_t x_stride, T* out, int64_t rows, int64_t d) {
  at::parallel_for(0, rows, row_grain(2 * d), [&](int64_t begin, int64_t end) {
    std::vector<float> gate(d);
    for (int64_t r = begin; r < end; ++r) {
      const T* g = x + r * x_stride;
      const T* u = g + d;
      T* o = out + r * d;
      for (int64_t j = 0; j < d; ++j) gate[j] = to_float(g[j]);
      int64_t j = 0;
      for (; j + kBVec <= d; j += kBVec) {  // on bvecs: the scalar loop did not vectorize
        const bvec gv = loadb(gate.data() + j);
        storeb(gate.data() + j, gv / (1.0f + exp_of(-gv)));
      }
      for (; j < d; ++j) gate[j] = gate[j] / (1.0f + exp_of(-gate[j]));
      for (int64_t j = 0; j < d; ++j) o[j] = static_cast<T>(gate[j] * to_float(u[j]));
    }
  });
}

// sum <- x + residual (rounded to T, as torch's add is); out <- rms_norm(sum) * weight.
template <typename T>
void add_rms_norm_rows(const T* x, int64_t x_stride, const T* residual, T* sum_out,
                       const T* weight, T* out, int64_t rows, int64_t d, float eps) {
  at::parallel_for(0, rows, row_grain(d), [&](int64_t begin, int64_t end) {
    std::vector<float> sum(d);
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * x_stride;
      const T* res = residual + r * d;
      T* so = sum_out + r * d;
      for (int64_t j = 0; j < d; ++j) {
        so[j] = static_cast<T>(to_float(xr[j]) + to_float(res[j]));
        sum[j] = to_float(so[j]);
      }
      float partial[kLanes] = {0.0f};
      int64_t j = 0;
      for (; j + kLanes <= d; j += kLanes) {
        for (int64_t l = 0; l < kLanes; ++l) partial[l] += sum[j + l] * sum[j + l];
      }
      float sq = 0.0f;
      for (int64_t l = 0; l < kLanes; ++l) sq += partial[l];
      for (; j < d; ++j) sq += sum[j] * sum[j];
      const float inv = 1.0f / std::sqrt(sq / static_cast<float>(d) + eps);
      T* o = out + r * d;
      for (int64_t k = 0; k < d; ++k) o[k] = static_cast<T>(sum[k] * inv * to_float(weight[k]));
    }
  });
}

// out[t, h] <- x[t, h] rotated by cos[t], sin[t] (halves rotated against each other,
// the NeoX / HF Llama layout), computed in float and rounded once.
template <typename T>
void rotary_rows(const T* x, int64_t x_stride, const T* cos, const T* sin, int64_t cs_stride,
                 T* out, int64_t tokens, int64_t heads, int64_t d) {
  const int64_t half = d / 2;
  at::parallel_for(0, tokens, row_grain(heads * d), [&](int64_t begin, int64_t end) {
    std::vector<float> c(half), s(half);
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t j = 0; j < half; ++j) {
        c[j] = to_float(cos[t * cs_stride + j]);
        s[j] = to_float(sin[t * cs_stride + j]);
      }
      for (int64_t h = 0; h < heads; ++h) {
        const T* xr = x + t * x_stride + h * d;
        T* o = out + (t * heads + h) * d;
        for (int64_t j = 0; j < half; ++j) {
          const float x1 = to_float(xr[j]), x2 = to_float(xr[j + half]);
          o[j] = static_cast<T>(x1 * c[j] - x2 * s[j]);
          o[j + half] = static_cast<T>(x2 * c[j] + x1 * s[j]);
        }
      }
    }
  });
}

void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.stride(1) == 1,
              name, ": a CPU tensor [T, d] with contiguous rows");
}

}  // namespace

// x [T, 2d] (rows may be strided) -> silu(x[:, :d]) * x[:, d:], [T, d].
at::Tensor silu_and_mul(const at::Tensor& x) {
  check_rows(x, "silu_and_mul");
  TORCH_CHECK(x.size(1) % 2 == 0, "silu_and_mul: an even last dimension");
  const int64_t rows = x.size(0), d = x.size(1) / 2;
  auto out = at::empty({rows, d}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "silu_and_mul", [&] {
    silu_and_mul_rows<scalar_t>(x.data_ptr<scalar_t>(), x.stride(0), out.data_ptr<scalar_t>(),
                                rows, d);
  });
  return out;
}

// x [T, d] (rows may be strided), residual [T, d] contiguous, weight [d] ->
// (rms_norm(x + residual) * weight, x + residual), each [T, d]: the pre-norm block's
// normed input and residual stream.
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps) {
  check_rows(x, "add_rms_norm");
  TORCH_CHECK(residual.is_contiguous() && residual.sizes() == x.sizes() &&
                  residual.scalar_type() == x.scalar_type(),
              "add_rms_norm: residual must be a contiguous tensor like x");
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == x.size(1) &&
                  weight.scalar_type() == x.scalar_type(),
              "add_rms_norm: weight [d] in x's dtype");
  const int64_t rows = x.size(0), d = x.size(1);
  auto out = at::empty({rows, d}, x.options());
  auto sum = at::empty({rows, d}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rms_norm", [&] {
    add_rms_norm_rows<scalar_t>(x.data_ptr<scalar_t>(), x.stride(0),
                                residual.data_ptr<scalar_t>(), sum.data_ptr<scalar_t>(),
                                weight.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), rows, d,
                                static_cast<float>(eps));
  });
  return {out, sum};
}

// x [M, K] (M <= kSmallBatchRows, rows may be strided), w [N, K] contiguous, bias [N]
// or undefined -> x w^T + bias, [M, N]. A decode step of one or two requests is a
// matrix-vector product that only streams the weight: each thread walks its rows of
// w once, in order, converting 32 elements at a time and multiplying them into
// every row of x. oneDNN's packed bfloat16 kernel reached ~60% of the memory
// bandwidth at one row; this reaches ~90% (1.45x at one row and at two; at three
// rows the two are even, from four on oneDNN's bf16 dot products win).
constexpr int64_t kSmallBatchRows = 2;
constexpr int64_t kSmallBatchStep = 32;

template <int64_t kM, typename T>
void small_batch_rows(const float* xf, int64_t K, const T* w, const T* bias, T* out,
                      int64_t N, int64_t begin, int64_t end) {
  for (int64_t n = begin; n < end; ++n) {
    const T* wr = w + n * K;
    f32x16 acc[kM][2] = {};
    for (int64_t k = 0; k < K; k += kSmallBatchStep) {
      float wf[kSmallBatchStep];
      for (int64_t i = 0; i < kSmallBatchStep; ++i) wf[i] = to_float(wr[k + i]);
      const f32x16 w0 = load16(wf), w1 = load16(wf + kVec);
      for (int64_t m = 0; m < kM; ++m) {
        acc[m][0] += w0 * load16(xf + m * K + k);
        acc[m][1] += w1 * load16(xf + m * K + k + kVec);
      }
    }
    const float b = bias != nullptr ? to_float(bias[n]) : 0.0f;
    for (int64_t m = 0; m < kM; ++m) {
      float lanes[kVec];
      store16(lanes, acc[m][0] + acc[m][1]);
      out[m * N + n] = static_cast<T>(lane_sum(lanes, kVec) + b);
    }
  }
}

template <typename T>
void small_batch_impl(const float* xf, int64_t M, int64_t K, const T* w, const T* bias, T* out,
                      int64_t N) {
  at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) {
    if (M == 1) return small_batch_rows<1>(xf, K, w, bias, out, N, begin, end);
    return small_batch_rows<2>(xf, K, w, bias, out, N, begin, end);
  });
}

at::Tensor small_batch_linear(const at::Tensor& x, const at::Tensor& w,
                              const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && w.dim() == 2 && w.is_contiguous() &&
                  x.size(1) == w.size(1) && x.scalar_type() == w.scalar_type(),
              "small_batch_linear: x [M, K] and a contiguous w [N, K] of one dtype");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(M >= 1 && M <= kSmallBatchRows && K % kSmallBatchStep == 0,
              "small_batch_linear: 1 or 2 rows, K a multiple of 32");
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = bias->contiguous();
    TORCH_CHECK(b.numel() == N && b.scalar_type() == x.scalar_type(), "small_batch_linear: bias [N]");
  }
  auto xf = x.to(at::kFloat).contiguous();
  auto out = at::empty({M, N}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "small_batch", [&] {
    small_batch_impl<scalar_t>(xf.data_ptr<float>(), M, K, w.data_ptr<scalar_t>(),
                               b.defined() ? b.data_ptr<scalar_t>() : nullptr,
                               out.data_ptr<scalar_t>(), N);
  });
  return out;
}

// x [T, n, D] (tokens may be strided; heads and dims contiguous), cos and sin
// [T, 1, D / 2] (last dim contiguous) -> x rotated, [T, n, D] contiguous.
at::Tensor rotary_embedding(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 3 && x.stride(2) == 1 &&
                  x.stride(1) == x.size(2) && x.size(2) % 2 == 0,
              "rotary_embedding: a CPU tensor [T, n, D] with contiguous heads, D even");
  const int64_t tokens = x.size(0), heads = x.size(1), d = x.size(2);
  for (const auto* t : {&cos, &sin}) {
    TORCH_CHECK(t->dim() == 3 && t->size(0) == tokens && t->size(2) == d / 2 &&
                    t->stride(2) == 1 && t->scalar_type() == x.scalar_type(),
                "rotary_embedding: cos and sin [T, 1, D / 2] in x's dtype");
  }
  TORCH_CHECK(cos.stride(0) == sin.stride(0), "rotary_embedding: cos and sin strided alike");
  auto out = at::empty({tokens, heads, d}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rotary", [&] {
    rotary_rows<scalar_t>(x.data_ptr<scalar_t>(), x.stride(0), cos.data_ptr<scalar_t>(),
                          sin.data_ptr<scalar_t>(), cos.stride(0), out.data_ptr<scalar_t>(),
                          tokens, heads, d);
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> quantize_per_token_op(const at::Tensor& x) {
  auto out = quantize_per_token(x);
  return {out[0], out[1]};
}

// torch.ops.radixlm.*: real operators, so the profiler and torch.compile see them.
TORCH_LIBRARY(radixlm, m) {
  m.def(
      "paged_attention(Tensor q, Tensor k_buf, Tensor v_buf, Tensor req_to_token, "
      "Tensor req_rows, Tensor seq_lens, Tensor q_starts, Tensor q_lens, float scale) -> Tensor");
  m.def("quantize_per_token(Tensor x) -> (Tensor, Tensor)");
  m.def("int8_linear(Tensor x, Tensor w_t, Tensor w_scales, Tensor? bias) -> Tensor");
  m.def("silu_and_mul(Tensor x) -> Tensor");
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("rotary_embedding(Tensor x, Tensor cos, Tensor sin) -> Tensor");
  m.def("small_batch_linear(Tensor x, Tensor w, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) {
  m.impl("paged_attention", &paged_attention);
  m.impl("quantize_per_token", &quantize_per_token_op);
  m.impl("int8_linear", &int8_linear);
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("rotary_embedding", &rotary_embedding);
  m.impl("small_batch_linear", &small_batch_linear);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}
