// kv_store: a step's K and V into the pool at their slots, in the pool's format
// (mem_cache/kv_format.py): a plain row copy for a pool in a float dtype, and for a
// quantized pool the rows quantized as they are written (int8 with its per token
// and head scale, fp8 clamped to its range), bit for bit what kv_format.quantize_rows
// computes. The one way K/V get into the pool: the attention backends call it
// through TokenToKVPool.set_kv_buffer, the C++ layer stack directly.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Half.h>

#include "kv_format.h"
#include "ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace {

// One (token, head) row of head_dim values, converted to float, quantized into `dst`.
template <typename T>
void load_floats(const T* src, int64_t n, float* out) {
  for (int64_t d = 0; d < n; ++d) out[d] = static_cast<float>(src[d]);
}

// x (modified: rotated in place) into an int8 row (kv_format.h).
void quantize_int8_row(float* x, int64_t head_dim, int8_t* dst) {
  const int64_t block = radixlm::kv_int8_block(head_dim);
  radixlm::hadamard_blocks(x, head_dim, block);
  for (int64_t b0 = 0, b = 0; b0 < head_dim; b0 += block, ++b) {
    float amax = 0.0f;
    for (int64_t d = b0; d < b0 + block; ++d) amax = std::max(amax, std::fabs(x[d]));
    // as kv_format.py: the scale rounded to float16 first, then x / scale
    const c10::Half scale16(amax / 127.0f);
    const float scale = static_cast<float>(scale16);
    for (int64_t d = b0; d < b0 + block; ++d) {
      const float q = scale > 0.0f ? std::nearbyint(x[d] / scale) : 0.0f;  // half to even
      dst[d] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, q)));
    }
    std::memcpy(dst + head_dim + 2 * b, &scale16.x, sizeof(scale16.x));
  }
}

template <typename F8>
void quantize_fp8_row(const float* x, int64_t head_dim, F8* dst) {
  const float limit = static_cast<float>(std::numeric_limits<F8>::max());
  for (int64_t d = 0; d < head_dim; ++d) {
    dst[d] = static_cast<F8>(std::min(limit, std::max(-limit, x[d])));
  }
}

// src [T, Hkv, D] (rows and heads strided, dims contiguous) into buf at slots loc.
template <typename T>
void store_quantized(at::Tensor& buf, const int64_t* loc, const at::Tensor& src,
                     radixlm::KvFormat format) {
  const int64_t tokens = src.size(0), heads = src.size(1), head_dim = src.size(2);
  const int64_t row_width = buf.size(2);
  const T* x = static_cast<const T*>(src.const_data_ptr());
  const int64_t t_stride = src.stride(0), h_stride = src.stride(1);
  char* out = static_cast<char*>(buf.data_ptr());
  const int64_t row_bytes = row_width * static_cast<int64_t>(buf.element_size());
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(heads * head_dim, 1));
  at::parallel_for(0, tokens, grain, [&](int64_t begin, int64_t end) {
    float row[radixlm::kMaxHeadDim];
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        load_floats(x + t * t_stride + h * h_stride, head_dim, row);
        char* dst = out + (loc[t] * heads + h) * row_bytes;
        switch (format) {
          case radixlm::KvFormat::kInt8:
            quantize_int8_row(row, head_dim, reinterpret_cast<int8_t*>(dst));
            break;
          case radixlm::KvFormat::kFp8E4m3:
            quantize_fp8_row(row, head_dim, reinterpret_cast<c10::Float8_e4m3fn*>(dst));
            break;
          default:
            quantize_fp8_row(row, head_dim, reinterpret_cast<c10::Float8_e5m2*>(dst));
            break;
        }
      }
    }
  });
}

void store_one(at::Tensor& buf, const at::Tensor& loc, const at::Tensor& src) {
  TORCH_CHECK(src.dim() == 3 && src.size(1) == buf.size(1) && src.size(0) == loc.size(0),
              "kv_store: K/V [T, Hkv, D] for T slots of a pool [slots, Hkv, row]");
  const radixlm::KvFormat format = radixlm::kv_format_of(buf.scalar_type());
  if (format == radixlm::KvFormat::kPlain) {
    // index_copy_, not buf[loc] = src: a plain row copy (index_put_ cost ~7% of a
    // batch-32 decode step).
    buf.index_copy_(0, loc, src.to(buf.scalar_type()));
    return;
  }
  const int64_t head_dim = src.size(2);
  TORCH_CHECK(buf.size(2) == radixlm::kv_row_width(format, head_dim),
              "kv_store: a pool row of ", buf.size(2), " elements does not hold ", head_dim,
              " values in ", buf.scalar_type());
  TORCH_CHECK(head_dim <= radixlm::kMaxHeadDim, "kv_store: head dim over ",
              radixlm::kMaxHeadDim);
  TORCH_CHECK(buf.is_contiguous(), "kv_store: the pool buffer must be contiguous");
  const at::Tensor rows = src.stride(2) == 1 ? src : src.contiguous();
  const at::Tensor slots = loc.contiguous();
  const int64_t* slot_ptr = slots.const_data_ptr<int64_t>();
  for (int64_t t = 0; t < slots.size(0); ++t) {
    TORCH_CHECK(slot_ptr[t] >= 0 && slot_ptr[t] < buf.size(0), "kv_store: slot ", slot_ptr[t],
                " out of range");
  }
  switch (rows.scalar_type()) {
    case at::kFloat:
      return store_quantized<float>(buf, slot_ptr, rows, format);
    case at::kBFloat16:
      return store_quantized<c10::BFloat16>(buf, slot_ptr, rows, format);
    case at::kHalf:
      return store_quantized<c10::Half>(buf, slot_ptr, rows, format);
    default:
      TORCH_CHECK(false, "kv_store: K/V must be float32, bfloat16 or float16, not ",
                  rows.scalar_type());
  }
}

}  // namespace

// k_buf, v_buf [slots, Hkv, row] (the pool's, modified); loc [T] int64 slots; k, v
// [T, Hkv, D] in a float dtype. The pool's dtype says its format (kv_format.h).
void kv_store(at::Tensor k_buf, at::Tensor v_buf, const at::Tensor& loc, const at::Tensor& k,
              const at::Tensor& v) {
  TORCH_CHECK(loc.scalar_type() == at::kLong && loc.dim() == 1, "kv_store: loc [T] int64");
  TORCH_CHECK(k_buf.dim() == 3 && v_buf.sizes() == k_buf.sizes() &&
                  v_buf.scalar_type() == k_buf.scalar_type(),
              "kv_store: K and V buffers of one shape and dtype");
  store_one(k_buf, loc, k);
  store_one(v_buf, loc, v);
}
