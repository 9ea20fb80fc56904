// The KV pool's storage formats (mem_cache/kv_format.py), as the kernels that write
// (kv_store.cpp) and read (attention*) the pool tell them apart: by the buffers'
// dtype alone.
//
//   plain     float32 / bfloat16 / float16 rows of head_dim values
//   int8      head_dim int8 values, then a float16 scale per block of
//             B = gcd(head_dim, 32) values: block b holds round(H y / s_b), H the
//             orthonormal B-point Hadamard transform of the block's values y,
//             s_b = fp16(max |H y| / 127); y = H (q s_b) (H is its own inverse)
//   fp8_e4m3  float8_e4m3fn rows of head_dim values, no scale
//   fp8_e5m2  float8_e5m2 rows of head_dim values, no scale
#pragma once

#include <c10/core/ScalarType.h>

#include <cmath>
#include <cstdint>
#include <numeric>

namespace radixlm {

enum class KvFormat : int { kPlain = 0, kInt8 = 1, kFp8E4m3 = 2, kFp8E5m2 = 3 };

constexpr int64_t kMaxHeadDim = 1024;  // a row converted at a time fits on the stack

inline KvFormat kv_format_of(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Char:
      return KvFormat::kInt8;
    case c10::ScalarType::Float8_e4m3fn:
      return KvFormat::kFp8E4m3;
    case c10::ScalarType::Float8_e5m2:
      return KvFormat::kFp8E5m2;
    default:
      return KvFormat::kPlain;
  }
}

// Values per scale and per rotation of an int8 row.
constexpr int64_t kv_int8_block(int64_t head_dim) { return std::gcd<int64_t>(head_dim, 32); }

// Storage elements of one (slot, head) row.
inline int64_t kv_row_width(KvFormat format, int64_t head_dim) {
  return format == KvFormat::kInt8 ? head_dim + 2 * (head_dim / kv_int8_block(head_dim))
                                   : head_dim;
}

// x[0 .. n) with each block of `block` values (a power of two) replaced by its
// orthonormal Hadamard transform, in place: butterflies of stride 1, 2, 4, .. and
// then the factor 1/sqrt(block) as a float, as kv_format.hadamard_blocks computes it
// (the quantizer's bits depend on this order). Its own inverse.
inline void hadamard_blocks(float* x, int64_t n, int64_t block) {
  const float norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(block)));
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    float* y = x + b0;
    for (int64_t h = 1; h < block; h *= 2) {
      for (int64_t i = 0; i < block; i += 2 * h) {
        for (int64_t j = i; j < i + h; ++j) {
          const float a = y[j], c = y[j + h];
          y[j] = a + c;
          y[j + h] = a - c;
        }
      }
    }
    for (int64_t j = 0; j < block; ++j) y[j] *= norm;
  }
}

}  // namespace radixlm
