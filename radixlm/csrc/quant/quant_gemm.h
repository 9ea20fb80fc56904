// What the quantized matmul kernels (quant_gemm_legacy.cpp, quant_gemm_k.cpp) take
// and the activation quantizer (quant_linear.cpp) gives them.
#pragma once

#include "quant_layout.h"

#include <cstdint>

namespace radixlm::quant {

// M rows of activations quantized to int8 per block (llama.cpp's Q8_0 for the legacy
// formats, blocks of 32; Q8_K for the K-quants, blocks of 256), with the integer sums
// of every 16 and 32 inputs and those sums times the block's scale.
struct QuantizedRows {
  const int8_t* q;       // [M][ld_q]
  const float* d;        // [M][ld_d]: one scale per block
  const int32_t* bs16;   // [M][ld_16]: sum of q over each 16 inputs
  const int32_t* bs32;   // [M][ld_32]
  const float* bsf16;    // [M][ld_16]: d * bs16
  const float* bsf32;    // [M][ld_32]
  int64_t ld_q, ld_d, ld_16, ld_32;
};

// out[m][n] = sum_k x[m][k] w[n][k] (+ bias[n]) for one segment of a packed weight.
struct GemmArgs {
  const uint8_t* w;  // the segment's first group
  int64_t n, k, groups;
  const QuantizedRows* act;
  int64_t m;
  void* out;     // [m][ldo] float32 or bfloat16, the segment's first column
  int64_t ldo;
  bool out_bf16;
  const float* bias;  // [n] or null
};

// The kernel for the active ISA level (isa.h); false if `type` is not in the family.
bool gemm_legacy(int32_t type, const GemmArgs& args);
bool gemm_k(int32_t type, const GemmArgs& args);

// The AMX tiles (quant_gemm_amx.cpp) from amx_rows(type) rows on: 16 where a sub-block
// is 32 inputs of 4 or 5 bits; 32 for Q8_0 (its VNNI tile unpacks nothing) and for the
// 16-input sub-blocks (Q2_K, Q3_K, Q6_K: a tile store per 16 inputs). Measured on a
// 2-core Xeon with AMX: below 16 rows every format ran slower on the tiles; at 16 rows
// Q4_K 1.6x faster, Q6_K and Q8_0 0.85-0.9x; at 32 all within noise or faster.
// gemm_amx is false where the tiles do not run (fewer rows, no AMX, an ISA level below
// avx512bf16, or turned off).
constexpr int64_t amx_rows(int32_t type) {
  return type == kQ8_0 || type == kQ2_K || type == kQ3_K || type == kQ6_K ? 32 : 16;
}
bool gemm_amx(int32_t type, const GemmArgs& args);
bool amx_supported();  // the CPU has AMX-INT8 and the OS lent its tile state
bool amx_active();     // supported, enabled and at the avx512bf16 level

// Quantizes rows of x (float32 or bfloat16 [m][ldx]) per block of `block` (32: Q8_0,
// 256: Q8_K) into the buffers of `out`.
void quantize_rows(const void* x, bool x_bf16, int64_t ldx, int64_t m, int64_t k, int64_t block,
                   QuantizedRows& out, int8_t* q, float* d, int32_t* bs16, int32_t* bs32,
                   float* bsf16, float* bsf32);

}  // namespace radixlm::quant
