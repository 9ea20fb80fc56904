// The KV pool's storage formats (mem_cache/kv_format.py), as the kernels that write
// (kv_store.cpp) and read (attention*) the pool tell them apart: by the buffers'
// dtype alone.
//
//   plain     float32 / bfloat16 / float16 rows of head_dim values
//   int8      head_dim int8 values, then the row's float32 scale (4 bytes):
//             x = q * scale, scale = max |x| / 127 (one per token and head)
//   fp8_e4m3  float8_e4m3fn rows of head_dim values, no scale
//   fp8_e5m2  float8_e5m2 rows of head_dim values, no scale
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace radixlm {

enum class KvFormat : int { kPlain = 0, kInt8 = 1, kFp8E4m3 = 2, kFp8E5m2 = 3 };

constexpr int64_t kInt8ScaleBytes = 4;  // the float32 scale after an int8 row
constexpr int64_t kMaxHeadDim = 1024;   // a row converted at a time fits on the stack

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

// Storage elements of one (slot, head) row.
inline int64_t kv_row_width(KvFormat format, int64_t head_dim) {
  return format == KvFormat::kInt8 ? head_dim + kInt8ScaleBytes : head_dim;
}

}  // namespace radixlm
