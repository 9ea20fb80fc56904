// Which ISA level the kernels run at (isa.h), and the ops that show and set it.
#include "isa.h"

#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

namespace radixlm {
namespace {

constexpr Isa kLevels[] = {Isa::kAvx512Bf16, Isa::kAvx512, Isa::kAvx2};

Isa detect() {
#ifdef RADIXLM_ISA_NATIVE
  return Isa::kNative;
#else
  Isa best = Isa::kAvx2;  // the build covers no less (the loader checks before loading)
  for (Isa isa : kLevels) {
    if (cpu_supports(isa)) {
      best = isa;
      break;
    }
  }
  Isa cap;
  const char* env = std::getenv("RADIXLM_ISA");
  if (env != nullptr && *env != '\0' && isa_from_name(env, &cap) &&
      static_cast<int>(cap) < static_cast<int>(best)) {
    best = cap;
  }
  return best;
#endif
}

std::atomic<int>& active() {
  static std::atomic<int> level{static_cast<int>(detect())};
  return level;
}

}  // namespace

bool cpu_supports(Isa isa) {
#if defined(__x86_64__) && !defined(RADIXLM_ISA_NATIVE)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd");
  switch (isa) {
    case Isa::kAvx2:
      return avx2;
    case Isa::kAvx512:
      return avx512;
    case Isa::kAvx512Bf16:
      return avx512 && __builtin_cpu_supports("avx512vnni") &&
             __builtin_cpu_supports("avx512bf16");
    case Isa::kNative:
      return false;
  }
  return false;
#else
  return isa == Isa::kNative;
#endif
}

Isa active_isa() { return static_cast<Isa>(active().load(std::memory_order_relaxed)); }

void set_active_isa(Isa isa) {
  TORCH_CHECK(cpu_supports(isa), "radixlm kernels: this CPU (or build) has no ", isa_name(isa));
  active().store(static_cast<int>(isa), std::memory_order_relaxed);
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx512Bf16:
      return "avx512bf16";
    case Isa::kNative:
      return "native";
  }
  return "?";
}

bool isa_from_name(const char* name, Isa* out) {
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16, Isa::kNative}) {
    if (std::strcmp(name, isa_name(isa)) == 0) {
      *out = isa;
      return true;
    }
  }
  return false;
}

}  // namespace radixlm

namespace {

std::string isa_op() { return radixlm::isa_name(radixlm::active_isa()); }

std::vector<std::string> supported_isas_op() {
  std::vector<std::string> out;
  for (radixlm::Isa isa : {radixlm::Isa::kAvx2, radixlm::Isa::kAvx512, radixlm::Isa::kAvx512Bf16,
                           radixlm::Isa::kNative}) {
    if (radixlm::cpu_supports(isa)) out.emplace_back(radixlm::isa_name(isa));
  }
  return out;
}

void set_isa_op(const std::string& name) {
  radixlm::Isa isa;
  TORCH_CHECK(radixlm::isa_from_name(name.c_str(), &isa), "unknown ISA level '", name,
              "' (avx2, avx512, avx512bf16, native)");
  radixlm::set_active_isa(isa);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("isa() -> str", &isa_op);
  m.def("supported_isas() -> str[]", &supported_isas_op);
  m.def("set_isa(str name) -> ()", &set_isa_op);
}
