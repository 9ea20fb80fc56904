// Float weights into GGUF blocks (`--quantization q8_0 | q4_0 | q4_k` of a Hugging
// Face checkpoint, and test fixtures): llama.cpp's reference quantizers
// (quantize_row_q8_0_ref, quantize_row_q4_0_ref, quantize_row_q4_K_ref with its
// make_qkx2_quants search), written again here. The rows come out as a GGUF file
// stores them, so the same repacking (quant_pack.cpp) takes both.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "quant_layout.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace radixlm::quant {
namespace {

inline int nearest_int(float f) { return static_cast<int>(std::nearbyint(f)); }

void store_half(uint8_t* p, float v) {
  const uint16_t h = float_to_half(v);
  std::memcpy(p, &h, 2);
}

float load_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
}

void q8_0_block(const float* x, uint8_t* out) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  store_half(out, d);
  for (int i = 0; i < 32; ++i) out[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(x[i] * id)));
}

void q4_0_block(const float* x, uint8_t* out) {
  float amax = 0.0f, max = 0.0f;
  for (int i = 0; i < 32; ++i) {
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), max = x[i];
  }
  const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  store_half(out, d);
  for (int j = 0; j < 16; ++j) {
    const int a = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
    const int b = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 8.5f)));
    out[2 + j] = static_cast<uint8_t>(a | (b << 4));
  }
}

// A scale and a min for n values quantized to [0, nmax] (weighted least squares over
// nstep candidate scales); returns the scale, *the_min = -min.
float make_qkx2_quants(int n, int nmax, const float* x, const float* w, uint8_t* L,
                       float* the_min, uint8_t* laux, float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    min = std::min(min, x[i]), max = std::max(max, x[i]);
    sum_w += w[i], sum_x += w[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(L, L + n, 0);
    *the_min = -min;
    return 0.0f;
  }
  float iscale = nmax / (max - min), scale = 1 / iscale, best_error = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax));
    const float diff = scale * L[i] + min - x[i];
    best_error += w[i] * diff * diff;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
      laux[i] = static_cast<uint8_t>(l);
      sum_l += w[i] * l, sum_l2 += w[i] * l * l, sum_xl += w[i] * l * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
      if (this_min > 0) this_min = 0, this_scale = sum_xl / sum_l2;
      float err = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * laux[i] + this_min - x[i];
        err += w[i] * diff * diff;
      }
      if (err < best_error) {
        std::memcpy(L, laux, n);
        best_error = err, scale = this_scale, min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

void q4_k_block(const float* x, uint8_t* out) {
  uint8_t L[256], laux[32], sc12[12] = {};
  float mins[8], scales[8], weights[32], max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float* xj = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xj[l] * xj[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xj[l]);
    scales[j] = make_qkx2_quants(32, 15, xj, weights, L + 32 * j, &mins[j], laux, -1.0f, 0.1f, 20);
    max_scale = std::max(max_scale, scales[j]), max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  for (int j = 0; j < 8; ++j) {
    const int ls = std::min(63, nearest_int(inv_scale * scales[j]));
    const int lm = std::min(63, nearest_int(inv_min * mins[j]));
    if (j < 4) {
      sc12[j] = static_cast<uint8_t>(ls), sc12[j + 4] = static_cast<uint8_t>(lm);
    } else {
      sc12[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      sc12[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      sc12[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  store_half(out, max_scale / 63.0f);
  store_half(out + 2, max_min / 63.0f);
  std::memcpy(out + 4, sc12, 12);
  const float d = load_half(out), dmin = load_half(out + 2);
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    if (j < 4) {
      sc = sc12[j] & 63, m = sc12[j + 4] & 63;
    } else {
      sc = (sc12[j + 4] & 0xF) | ((sc12[j - 4] >> 6) << 4);
      m = (sc12[j + 4] >> 4) | ((sc12[j] >> 6) << 4);
    }
    const float dj = d * sc;
    if (dj == 0.0f) continue;
    const float dm = dmin * m;
    for (int i = 0; i < 32; ++i) {
      L[32 * j + i] = static_cast<uint8_t>(std::clamp(nearest_int((x[32 * j + i] + dm) / dj), 0, 15));
    }
  }
  uint8_t* q = out + 16;
  for (int j = 0; j < 256; j += 64, q += 32) {
    for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
  }
}

}  // namespace

// weight [N, K] float32 -> [N, K / block * block_bytes] uint8 GGUF rows of `type`
// (Q8_0, Q4_0 or Q4_K).
at::Tensor q_quantize(const at::Tensor& weight, int64_t type) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat, "q_quantize: float32 [N, K]");
  TORCH_CHECK(type == kQ8_0 || type == kQ4_0 || type == kQ4_K,
              "q_quantize: Q8_0, Q4_0 or Q4_K, not GGML type ", type);
  const Format& f = *find_format(type);
  const at::Tensor w = weight.contiguous();
  const int64_t n = w.size(0), k = w.size(1);
  TORCH_CHECK(k % f.block == 0, "q_quantize: K = ", k, " is not a multiple of ", f.block);
  const int64_t blocks = k / f.block;
  at::Tensor out = at::empty({n, blocks * f.block_bytes}, w.options().dtype(at::kByte));
  const float* src = w.data_ptr<float>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, n * blocks, 64, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const float* x = src + b * f.block;  // rows are whole blocks: block b of the matrix
      uint8_t* o = dst + b * f.block_bytes;
      if (type == kQ8_0) q8_0_block(x, o);
      else if (type == kQ4_0) q4_0_block(x, o);
      else q4_k_block(x, o);
    }
  });
  return out;
}

}  // namespace radixlm::quant

TORCH_LIBRARY_FRAGMENT(radixlm, m) { m.def("q_quantize(Tensor weight, int type) -> Tensor"); }

TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("q_quantize", &radixlm::quant::q_quantize); }
