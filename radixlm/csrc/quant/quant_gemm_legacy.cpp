// The quantized matmul for the legacy GGUF formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0):
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

bool gemm_legacy(int32_t type, const GemmArgs& args) {
  if (gemm_amx(type, args)) return true;
  switch (type) {
    case kQ4_0: RADIXLM_ISA_FN(gemm<kQ4_0>)(args); return true;
    case kQ4_1: RADIXLM_ISA_FN(gemm<kQ4_1>)(args); return true;
    case kQ5_0: RADIXLM_ISA_FN(gemm<kQ5_0>)(args); return true;
    case kQ5_1: RADIXLM_ISA_FN(gemm<kQ5_1>)(args); return true;
    case kQ8_0: RADIXLM_ISA_FN(gemm<kQ8_0>)(args); return true;
    default: return false;
  }
}

}  // namespace radixlm::quant
