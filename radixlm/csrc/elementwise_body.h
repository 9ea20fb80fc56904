// The fused element-wise kernels, one level's copy (an ISA body, see isa.h;
// elementwise.cpp instantiates it and holds the torch-facing glue).
//
// silu_and_mul, add_rms_norm and rotary_embedding: a decode step's element-wise
// work in one pass each, and in one thread while the tensor is small. torch runs
// them as 2, 7 and 7 operators, each a parallel region once it passes 32k
// elements: on a busy 2-core machine every region can wait a whole time slice for
// a descheduled thread (12% of a batch-32 step was in silu alone).
namespace {

#include "vec_body.h"

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

}  // namespace
