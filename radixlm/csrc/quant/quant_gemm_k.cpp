// The quantized matmul for the K-quant GGUF formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K):
// quant_gemm_body.h compiled once per ISA level.
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../claim_parallel.h"
#include "../isa.h"
#include "../pairs_tiles.h"
#include "quant_gemm.h"

#define RADIXLM_ISA_BODY "quant/quant_gemm_body.h"
#include "../isa_instantiate.h"
#undef RADIXLM_ISA_BODY

namespace radixlm::quant {

bool gemm_k(int32_t type, const GemmArgs& args) {
  if (gemm_amx(type, args)) return true;
  switch (type) {
    case kQ2_K: RADIXLM_ISA_FN(gemm<kQ2_K>)(args); return true;
    case kQ3_K: RADIXLM_ISA_FN(gemm<kQ3_K>)(args); return true;
    case kQ4_K: RADIXLM_ISA_FN(gemm<kQ4_K>)(args); return true;
    case kQ5_K: RADIXLM_ISA_FN(gemm<kQ5_K>)(args); return true;
    case kQ6_K: RADIXLM_ISA_FN(gemm<kQ6_K>)(args); return true;
    default: return false;
  }
}

}  // namespace radixlm::quant
