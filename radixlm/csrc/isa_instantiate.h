// Compiles the ISA body named by RADIXLM_ISA_BODY once per level (see isa.h).
// No include guard: a kernel file includes it once per body.
//
//   #include <...every header the body uses, including <immintrin.h>...>
//   #define RADIXLM_ISA_BODY "my_kernel_body.h"
//   #include "isa_instantiate.h"
//   #undef RADIXLM_ISA_BODY
//
// The body holds functions only (no #include, no include guard); it selects code
// with `#if RADIXLM_ISA_AVX512` etc. and must compile at every level. Each copy
// lives in namespace radixlm::isa_<level>; call the active one with RADIXLM_ISA_FN.
#ifndef RADIXLM_ISA_BODY
#error "define RADIXLM_ISA_BODY before including isa_instantiate.h"
#endif

#ifdef RADIXLM_ISA_NATIVE
// One copy for the CPU this was built on (compiled with -march=native).
#if defined(__AVX2__) && defined(__FMA__)
#define RADIXLM_ISA_AVX2 1
#else
#define RADIXLM_ISA_AVX2 0
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define RADIXLM_ISA_AVX512 1
#else
#define RADIXLM_ISA_AVX512 0
#endif
#if RADIXLM_ISA_AVX512 && defined(__AVX512BF16__) && defined(__AVX512VNNI__)
#define RADIXLM_ISA_AVX512BF16 1
#else
#define RADIXLM_ISA_AVX512BF16 0
#endif
namespace radixlm::isa_native {
#include RADIXLM_ISA_BODY
}  // namespace radixlm::isa_native
#undef RADIXLM_ISA_AVX2
#undef RADIXLM_ISA_AVX512
#undef RADIXLM_ISA_AVX512BF16
#else

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt")
#define RADIXLM_ISA_AVX2 1
#define RADIXLM_ISA_AVX512 0
#define RADIXLM_ISA_AVX512BF16 0
namespace radixlm::isa_avx2 {
#include RADIXLM_ISA_BODY
}  // namespace radixlm::isa_avx2
#undef RADIXLM_ISA_AVX2
#undef RADIXLM_ISA_AVX512
#undef RADIXLM_ISA_AVX512BF16
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt,avx512f,avx512bw,avx512vl,avx512dq,avx512cd")
#define RADIXLM_ISA_AVX2 1
#define RADIXLM_ISA_AVX512 1
#define RADIXLM_ISA_AVX512BF16 0
namespace radixlm::isa_avx512 {
#include RADIXLM_ISA_BODY
}  // namespace radixlm::isa_avx512
#undef RADIXLM_ISA_AVX2
#undef RADIXLM_ISA_AVX512
#undef RADIXLM_ISA_AVX512BF16
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target( \
    "avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt,avx512f,avx512bw,avx512vl,avx512dq,avx512cd,avx512vnni,avx512bf16")
#define RADIXLM_ISA_AVX2 1
#define RADIXLM_ISA_AVX512 1
#define RADIXLM_ISA_AVX512BF16 1
namespace radixlm::isa_avx512bf16 {
#include RADIXLM_ISA_BODY
}  // namespace radixlm::isa_avx512bf16
#undef RADIXLM_ISA_AVX2
#undef RADIXLM_ISA_AVX512
#undef RADIXLM_ISA_AVX512BF16
#pragma GCC pop_options

#endif
