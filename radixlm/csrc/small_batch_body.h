// small_batch_linear, one level's copy (an ISA body, see isa.h;
// small_batch_linear.cpp instantiates it and holds the torch-facing glue).
namespace {

#include "vec_body.h"

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

}  // namespace
