// Vector helpers the kernel bodies share (an ISA body fragment, see isa.h): a
// kernel's *_body.h includes this first, inside its level's namespace, so each
// level gets its own copy at its own vector width. No #include, no guard: a
// translation unit instantiates one body.
//
// Plain C++ loops written so the compiler vectorizes them for the level; where
// accumulators must stay in registers they are GCC/Clang vector-extension types
// (bvec, one register wide; f32x16), which the compiler maps to the level's vectors.

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
#if RADIXLM_ISA_AVX512
constexpr int64_t kBVec = 16;
constexpr int64_t kBlockVecs = 8;
constexpr int64_t kVectorRegisters = 32;
#else
constexpr int64_t kBVec = 8;
constexpr int64_t kBlockVecs = 4;
constexpr int64_t kVectorRegisters = 16;
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

// A vector of 16 floats (one zmm register or two ymm): small_batch_linear's
// accumulators and the bf16 pairs paths' lanes (kVec).
typedef float f32x16 __attribute__((vector_size(64)));
constexpr int64_t kVec = 16;

inline f32x16 load16(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store16(float* p, f32x16 v) { std::memcpy(p, &v, sizeof(v)); }
