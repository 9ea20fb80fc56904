// Run-time choice of the instruction set a kernel runs on.
//
// One build of the kernels serves every x86-64 CPU with AVX2: a kernel's
// ISA-specific body is compiled once per level (isa_instantiate.h), each copy in
// its own namespace and under its own `#pragma GCC target`, and the call picks
// the copy for the CPU it runs on (RADIXLM_ISA_FN).
//
// Levels (each includes the ones below it):
//   avx2        AVX2 + FMA + F16C (vpmaddubsw / vpmaddwd integer dot products)
//   avx512      + AVX-512 F/BW/VL/DQ/CD
//   avx512bf16  + AVX512_VNNI (vpdpbusd) and AVX512_BF16 (vdpbf16ps)
// A build for one machine only (RADIXLM_ISA_NATIVE, the JIT fallback with
// -march=native for CPUs the levels do not cover) has one copy, `native`.
//
// NOTE: inside a `#pragma GCC target` region g++ does not define __AVX512F__ and
// friends (C++ lexes ahead of the pragma), so ISA bodies test RADIXLM_ISA_AVX2,
// RADIXLM_ISA_AVX512 and RADIXLM_ISA_AVX512BF16, which isa_instantiate.h defines.
#pragma once

#include <cstdint>

namespace radixlm {

enum class Isa : int { kNative = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };

// The levels this CPU (and its OS) supports, the highest first checked.
bool cpu_supports(Isa isa);
// The level kernels run at now: the highest the CPU supports, capped by the
// environment variable RADIXLM_ISA (avx2 | avx512 | avx512bf16) or set_active_isa.
Isa active_isa();
// Run the kernels at `isa` from now on (tests run every path the CPU has);
// throws if the CPU lacks it.
void set_active_isa(Isa isa);
const char* isa_name(Isa isa);
bool isa_from_name(const char* name, Isa* out);

}  // namespace radixlm

// The copy of function `fn` (a name inside an ISA body, template arguments
// allowed) for the active level, as a function pointer:
//   RADIXLM_ISA_FN(gemv_rows<float>)(args...)
#ifdef RADIXLM_ISA_NATIVE
#define RADIXLM_ISA_FN(fn) (&::radixlm::isa_native::fn)
#else
#define RADIXLM_ISA_FN(fn)                                                 \
  (::radixlm::active_isa() == ::radixlm::Isa::kAvx512Bf16                   \
       ? &::radixlm::isa_avx512bf16::fn                                     \
       : ::radixlm::active_isa() == ::radixlm::Isa::kAvx512 ? &::radixlm::isa_avx512::fn \
                                                            : &::radixlm::isa_avx2::fn)
#endif
