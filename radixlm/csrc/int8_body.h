// The W8A8 linear's glue around oneDNN's int8 product, one level's copy (an ISA
// body, see isa.h; int8_linear.cpp instantiates it): per-token quantization of the
// activations before at::_int_mm, both scales (and the bias) after it, one pass each.
namespace {

#include "vec_body.h"

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
