// The quantized matmul on AMX tiles (Intel Sapphire Rapids and later: AMX-TILE,
// AMX-INT8), for every GGUF format, from amx_rows(type) rows on (prefill chunks,
// batches; quant_gemm.h).
//
// A 16-column group's levels are unpacked once per column tile into bytes laid out
// [quad][column][4] (tile_levels of quant_gemm_body.h): each quad is one row of an
// AMX B tile. One sub-block (16 or 32 inputs) of 16 activation rows (int8, signed)
// is the A tile, so one tdpbsud (signed A x unsigned B) gives a sub-block's integer
// sums for 16 rows x 16 columns, which the AVX-512 epilogue turns into floats as
// qtile does (times S * da; minus c * sum(a) in integers for implied offsets, M * da
// * sum(a) in floats for stored ones): the results equal the VNNI tile's. The AMX
// unit does the products, 16x the multiply-adds of vpdpbusd per instruction, so the
// epilogue and the unpacking are what is left.
//
// Linux hands out the tile state per process on request (arch_prctl
// ARCH_REQ_XCOMP_PERM); amx_supported() asks once. The tiles run only at the
// avx512bf16 ISA level (RADIXLM_ISA below it turns them off) and when enabled
// (RADIXLM_AMX=0 or set_amx(False) turns them off: the tests run both paths).
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && defined(__linux__) && !defined(RADIXLM_ISA_NATIVE)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define RADIXLM_AMX_BUILD 1
#else
#define RADIXLM_AMX_BUILD 0
#endif

#include "../claim_parallel.h"
#include "../isa.h"
#include "../pairs_tiles.h"
#include "quant_gemm.h"

#if RADIXLM_AMX_BUILD
#pragma GCC push_options
#pragma GCC target( \
    "avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt,avx512f,avx512bw,avx512vl,avx512dq,avx512cd,avx512vnni,avx512bf16,amx-tile,amx-int8")
#define RADIXLM_ISA_AVX2 1
#define RADIXLM_ISA_AVX512 1
#define RADIXLM_ISA_AVX512BF16 1
namespace radixlm::isa_amx {
#include "quant_gemm_body.h"

// The tile configuration (palette 1): tiles 0 and 1 hold the integer sums of two
// sub-blocks in flight, 2 and 3 their activations, 4 and 5 their levels.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

inline void configure_tiles(int rows, int sub) {
  TileConfig cfg;
  for (int t = 0; t < 2; ++t) {
    cfg.colsb[t] = 64;  // sums: [row][16 columns] int32
    cfg.rows[t] = static_cast<uint8_t>(rows);
    cfg.colsb[2 + t] = static_cast<uint16_t>(sub);  // activations: [row][sub] int8
    cfg.rows[2 + t] = static_cast<uint8_t>(rows);
    cfg.colsb[4 + t] = 64;  // levels: [quad][column][4]
    cfg.rows[4 + t] = static_cast<uint8_t>(sub / 4);
  }
  // (_tile_loadconfig tells the compiler it reads 8 bytes: the rest of cfg must be
  // stored first)
  asm volatile("" : : "m"(cfg) : "memory");
  _tile_loadconfig(&cfg);
}

constexpr int kAmxTileRows = 16;

// One sub-block's products into tile C (tile numbers must be literals: the intrinsics
// paste them into the instruction). Levels are signed where the format's offset is
// implied (shifted by -c at unpacking), unsigned otherwise.
#define RADIXLM_AMX_PRODUCT(C, A, B, a_ptr, lda, b_ptr)                   \
  do {                                                                    \
    _tile_zero(C);                                                        \
    _tile_loadd(A, a_ptr, lda);                                           \
    _tile_loadd(B, b_ptr, 2 * sizeof(I));                                 \
    if constexpr (kSignedLevels) {                                        \
      _tile_dpbssd(C, A, B);                                              \
    } else {                                                              \
      _tile_dpbsud(C, A, B);                                              \
    }                                                                     \
  } while (0)

template <int32_t kType>
void gemm_amx(const GemmArgs& g) {
  using V = Vec;
  using F = typename V::F;
  using I = typename V::I;
  constexpr Format f = format_of(kType);
  constexpr int kQuads = f.sub / 4;
  // Implied offsets (w = S * (u - c)) go into the levels: u - c fits int8 for every
  // such format (Q8_0: u = q + 128), and signed x signed products need no offset term.
  constexpr bool kSignedLevels = f.min_mul != 0;
  static_assert(kTileUnits == 2 && V::kCols == kGroup, "one unit a group, two a column tile");
  const ChunkLayout cl(f, g.k);
  const int64_t group_bytes = cl.group_bytes();
  const int64_t tiles = (g.groups + 1) / 2;
  const int64_t subs_total = cl.chunks * cl.subs;
  const int64_t subs_per_act = f.k_quant ? cl.subs : 1;  // sub-blocks per activation block
  const QuantizedRows& act = *g.act;
  const float* bsf = f.sub == 16 ? act.bsf16 : act.bsf32;
  const int64_t ld_bs = f.sub == 16 ? act.ld_16 : act.ld_32;
  radixlm::claim_parallel(tiles, [&](int64_t t, int64_t) {
    thread_local std::vector<uint8_t> level_bytes;
    const int64_t u0 = t * 2, nu = std::min<int64_t>(2, g.groups - u0);
    UnitPtr ptrs[2];
    for (int64_t u = 0; u < nu; ++u) ptrs[u] = {g.w + (u0 + u) * group_bytes, 0};
    const int64_t col0 = u0 * kGroup;
    const int64_t cols = std::min(nu * kGroup, g.n - col0);
    if (cols <= 0) return;
    const int64_t vectors = g.k / 4 * 2;
    auto* pre = reinterpret_cast<I*>(aligned_scratch(level_bytes, vectors * sizeof(I)));
    tile_levels<kType>(cl, ptrs, nu, pre);
    if constexpr (kSignedLevels) {
      const I c = V::set1_i8(static_cast<int8_t>(f.min_mul));
      for (int64_t v = 0; v < vectors; ++v) pre[v] = _mm512_sub_epi8(pre[v], c);
    }
    asm volatile("" ::: "memory");  // the tile loads below read these bytes
    alignas(64) int32_t sums[2][kAmxTileRows][kGroup];
    alignas(64) float out[kAmxTileRows][2 * kGroup];
    thread_local std::vector<uint8_t> bs_bytes;  // stored K offsets: the rows' sums(a) as floats
    float* bsn = nullptr;
    if constexpr (f.k_quant && f.stored_min) {
      bsn = reinterpret_cast<float*>(aligned_scratch(bs_bytes, kAmxTileRows * subs_total * 4));
    }
    int configured = 0;
    for (int64_t r0 = 0; r0 < g.m; r0 += kAmxTileRows) {
      const int nr = static_cast<int>(std::min<int64_t>(kAmxTileRows, g.m - r0));
      if (nr != configured) {
        configure_tiles(nr, f.sub);
        configured = nr;
      }
      const int8_t* aq = act.q + r0 * act.ld_q;
      if constexpr (f.k_quant && f.stored_min) {
        const int32_t* bs = (f.sub == 16 ? act.bs16 : act.bs32) + r0 * ld_bs;
        for (int r = 0; r < nr; ++r) {
          for (int64_t i = 0; i < subs_total; ++i) bsn[r * subs_total + i] = static_cast<float>(bs[r * ld_bs + i]);
        }
      }
      // One unit (16 columns) of the row tile; kFull: all 16 rows (no checks per row).
      const auto run_unit = [&](auto full_c, int64_t u) {
        constexpr bool kFull = decltype(full_c)::value;
        const I* lv = pre + u;
        // Legacy formats: acc = the result, da per sub-block. K-quants: acc = one
        // super-block's sum of S * sum(u * a) - M * sum(a), times da into out at its end.
        F acc[kAmxTileRows];
        for (int r = 0; r < kAmxTileRows; ++r) acc[r] = V::fzero();
        if constexpr (f.k_quant) {
          for (int r = 0; r < nr; ++r) V::store(out[r] + u * kGroup, V::fzero());
        }
        const auto epilogue = [&](int64_t s, const int32_t (*si)[kGroup]) {
          const int64_t c = s / cl.subs, j = s - c * cl.subs;
          const uint8_t* ch = ptrs[u].chunk + c * cl.bytes;
          if constexpr (f.k_quant) {
            const F sv = V::mul(V::half(reinterpret_cast<const uint16_t*>(ch + cl.d_off)),
                                V::from_i8(reinterpret_cast<const int8_t*>(ch + cl.sc_off) + j * kGroup));
            F mv = V::fzero();
            if constexpr (f.stored_min) {
              mv = V::mul(V::half(reinterpret_cast<const uint16_t*>(ch + cl.dmin_off)),
                          V::from_u8(ch + cl.m_off + j * kGroup));
            }
#pragma GCC unroll 16
            for (int r = 0; r < kAmxTileRows; ++r) {
              if (kFull || r < nr) {
                acc[r] = V::fma(V::cvt(_mm512_load_si512(si[r])), sv, acc[r]);
                if constexpr (f.stored_min) acc[r] = V::fnma(mv, V::set1(bsn[r * subs_total + s]), acc[r]);
              }
            }
            if (j == cl.subs - 1) {  // the super-block's end
              const float* da = act.d + r0 * act.ld_d + c;
#pragma GCC unroll 16
              for (int r = 0; r < kAmxTileRows; ++r) {
                if (kFull || r < nr) {
                  float* o = out[r] + u * kGroup;
                  V::store(o, V::fma(acc[r], V::set1(da[r * act.ld_d]), _mm512_load_ps(o)));
                  acc[r] = V::fzero();
                }
              }
            }
          } else {
            const F sv = V::half(reinterpret_cast<const uint16_t*>(ch + cl.d_off) + j * kGroup);
            F mv = V::fzero();
            if constexpr (f.stored_min) mv = V::half(reinterpret_cast<const uint16_t*>(ch + cl.dmin_off) + j * kGroup);
            const float* da = act.d + r0 * act.ld_d + s;
            const float* bf = bsf + r0 * ld_bs + s;
#pragma GCC unroll 16
            for (int r = 0; r < kAmxTileRows; ++r) {
              if (kFull || r < nr) {
                const F x = V::mul(V::cvt(_mm512_load_si512(si[r])), V::set1(da[r * act.ld_d]));
                acc[r] = V::fma(x, sv, acc[r]);
                if constexpr (f.stored_min) acc[r] = V::fnma(mv, V::set1(bf[r * ld_bs]), acc[r]);
              }
            }
          }
        };
        RADIXLM_AMX_PRODUCT(0, 2, 4, aq, act.ld_q, lv);
        for (int64_t s = 0; s < subs_total; s += 2) {
          const bool odd = s + 1 < subs_total;
          if (odd) RADIXLM_AMX_PRODUCT(1, 3, 5, aq + (s + 1) * f.sub, act.ld_q, lv + (s + 1) * kQuads * 2);
          _tile_stored(0, sums[0], kGroup * 4);
          epilogue(s, sums[0]);
          if (!odd) break;
          if (s + 2 < subs_total) RADIXLM_AMX_PRODUCT(0, 2, 4, aq + (s + 2) * f.sub, act.ld_q, lv + (s + 2) * kQuads * 2);
          _tile_stored(1, sums[1], kGroup * 4);
          epilogue(s + 1, sums[1]);
        }
        if constexpr (!f.k_quant) {
          for (int r = 0; r < nr; ++r) V::store(out[r] + u * kGroup, acc[r]);
        }
      };
      for (int64_t u = 0; u < nu; ++u) {
        if (nr == kAmxTileRows) {
          run_unit(std::true_type{}, u);
        } else {
          run_unit(std::false_type{}, u);
        }
      }
      store_tile(&out[0][0], 2 * kGroup, nr, cols, g, r0, col0);
    }
    _tile_release();
  });
}

#undef RADIXLM_AMX_PRODUCT

}  // namespace radixlm::isa_amx
#undef RADIXLM_ISA_AVX2
#undef RADIXLM_ISA_AVX512
#undef RADIXLM_ISA_AVX512BF16
#pragma GCC pop_options
#endif  // RADIXLM_AMX_BUILD

namespace radixlm::quant {

namespace {

bool detect_amx() {
#if RADIXLM_AMX_BUILD
  if (!cpu_supports(Isa::kAvx512Bf16)) return false;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  if (((d >> 24) & 1) == 0 || ((d >> 25) & 1) == 0) return false;  // AMX-TILE, AMX-INT8
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

std::atomic<bool>& amx_on() {
  static std::atomic<bool> on{[] {
    const char* env = std::getenv("RADIXLM_AMX");
    return !(env != nullptr && std::strcmp(env, "0") == 0);
  }()};
  return on;
}

}  // namespace

bool amx_supported() {
  static const bool ok = detect_amx();
  return ok;
}

bool amx_active() {
  return amx_on().load(std::memory_order_relaxed) && active_isa() == Isa::kAvx512Bf16 && amx_supported();
}

bool gemm_amx(int32_t type, const GemmArgs& args) {
#if RADIXLM_AMX_BUILD
  if (args.m < amx_rows(type) || !amx_active()) return false;
  switch (type) {
    case kQ4_0: isa_amx::gemm_amx<kQ4_0>(args); return true;
    case kQ4_1: isa_amx::gemm_amx<kQ4_1>(args); return true;
    case kQ5_0: isa_amx::gemm_amx<kQ5_0>(args); return true;
    case kQ5_1: isa_amx::gemm_amx<kQ5_1>(args); return true;
    case kQ8_0: isa_amx::gemm_amx<kQ8_0>(args); return true;
    case kQ2_K: isa_amx::gemm_amx<kQ2_K>(args); return true;
    case kQ3_K: isa_amx::gemm_amx<kQ3_K>(args); return true;
    case kQ4_K: isa_amx::gemm_amx<kQ4_K>(args); return true;
    case kQ5_K: isa_amx::gemm_amx<kQ5_K>(args); return true;
    case kQ6_K: isa_amx::gemm_amx<kQ6_K>(args); return true;
    default: return false;
  }
#else
  (void)type;
  (void)args;
  return false;
#endif
}

}  // namespace radixlm::quant

namespace {

bool amx_op() { return radixlm::quant::amx_active(); }
bool amx_supported_op() { return radixlm::quant::amx_supported(); }
void set_amx_op(bool on) {
  TORCH_CHECK(!on || radixlm::quant::amx_supported(), "radixlm kernels: this CPU (or build) has no AMX");
  radixlm::quant::amx_on().store(on, std::memory_order_relaxed);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("amx() -> bool", &amx_op);
  m.def("amx_supported() -> bool", &amx_supported_op);
  m.def("set_amx(bool on) -> ()", &set_amx_op);
}
