// The layout radixlm repacks GGUF block-quantized weights into, shared by the
// packer (quant_pack.cpp) and the kernels (quant_gemm_*.cpp).
//
// Every format becomes "unsigned integer levels u, a float scale S and a float
// offset M per sub-block of 16 or 32 inputs": w = S * u - M, where
//   legacy formats (Q4_0 .. Q8_0, blocks of 32): S = d, M = -m (Q4_1, Q5_1) or
//     M = c * S with c = 8 (Q4_0), 16 (Q5_0), 128 (Q8_0, u = q + 128);
//   K-quants (super-blocks of 256): S = d * sc, M = dmin * m per sub-block, or
//     M = c * S with c = 4 (Q3_K), 32 (Q6_K) (signed sc).
// With activations quantized to int8 per block (a, scale da, block sums), a
// sub-block's share of x.w is S * da * sum(u * a) - M * da * sum(a): one
// integer dot product of unsigned weights with signed activations (vpdpbusd,
// or vpmaddubsw + vpmaddwd), then two float operations. Implied offsets
// (M = c * S) fold into the integer sum: S * da * (sum(u * a) - c * sum(a)).
//
// Output columns (the weight's rows) go in groups of 16. A group's data runs
// over K in chunks (a K-quant super-block of 256, or `nb` legacy blocks of 32),
// each chunk:
//   scale area (padded to 64 bytes):
//     fp16 d[sub-blocks or 1][16]     legacy: S per block; K-quants: d
//     fp16 dmin[...][16]              if offsets are stored (legacy: M; K: dmin)
//     int8 sc[sub-blocks][16]         K-quants
//     uint8 m[sub-blocks][16]         K-quants with stored offsets
//   level planes, sub-block after sub-block. A "quad" is 4 consecutive inputs
//   of the 16 columns: 64 bytes [column][4], the layout of one vpdpbusd.
//     8 bits: one 64-byte vector per quad
//     4 bits (and the low 4 of 5 and 6): one vector per 2 quads, the first
//       quad in the low nibbles, the second in the high ones
//     2 bits (and the low 2 of 3, the high 2 of 6): one vector per 4 quads,
//       quad t of the 4 in bits 2t, 2t + 1
//     1 bit (the high bit of 3 and 5): 8 bytes per quad, bit b for byte b
// An AVX2 kernel takes a group as two halves of 8 columns: each 64-byte vector,
// each 8-byte mask and each [16] scale row splits into halves the same way.
//
// A packed weight ("blob", one uint8 tensor) holds one or more segments (the
// fused q/k/v or gate/up projections of one layer may have different formats),
// each a run of output columns: a BlobHeader, the segment table, then each
// segment's groups, 64-byte aligned.
#pragma once

#include <cstdint>
#include <cstring>

namespace radixlm::quant {

// GGML type ids (ggml.h).
enum GgmlType : int32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kBF16 = 30,
};

constexpr int64_t kGroup = 16;  // output columns per group
constexpr int64_t kQuadBytes = 64;

struct Format {
  int32_t type;
  int32_t bits;        // 2, 3, 4, 5, 6 or 8
  int32_t sub;         // inputs per sub-block (16 or 32)
  int32_t block;       // inputs per GGUF block (32 or 256)
  int32_t block_bytes; // bytes per GGUF block
  bool k_quant;        // super-blocks with int8 sub-scales
  bool stored_min;     // M stored (else M = min_mul * S)
  int32_t min_mul;
};

// nullptr for a type radixlm does not run quantized.
inline const Format* find_format(int64_t type) {
  static constexpr Format kFormats[] = {
      {kQ4_0, 4, 32, 32, 18, false, false, 8},   {kQ4_1, 4, 32, 32, 20, false, true, 0},
      {kQ5_0, 5, 32, 32, 22, false, false, 16},  {kQ5_1, 5, 32, 32, 24, false, true, 0},
      {kQ8_0, 8, 32, 32, 34, false, false, 128}, {kQ2_K, 2, 16, 256, 84, true, true, 0},
      {kQ3_K, 3, 16, 256, 110, true, false, 4},  {kQ4_K, 4, 32, 256, 144, true, true, 0},
      {kQ5_K, 5, 32, 256, 176, true, true, 0},   {kQ6_K, 6, 16, 256, 210, true, false, 32},
  };
  for (const Format& f : kFormats) {
    if (f.type == type) return &f;
  }
  return nullptr;
}

// Bytes of one sub-block's level planes for 16 columns.
constexpr int64_t plane_bytes(int32_t bits, int32_t sub) {
  const int64_t quads = sub / 4;
  switch (bits) {
    case 8: return quads * 64;
    case 6: return quads / 2 * 64 + quads / 4 * 64;
    case 5: return quads / 2 * 64 + quads * 8;
    case 4: return quads / 2 * 64;
    case 3: return quads / 4 * 64 + quads * 8;
    default: return quads / 4 * 64;  // 2
  }
}

constexpr int64_t round64(int64_t n) { return (n + 63) / 64 * 64; }

// Where things sit in one group's chunk.
struct ChunkLayout {
  int64_t inputs;       // K covered by one chunk
  int64_t subs;         // sub-blocks per chunk
  int64_t d_off, dmin_off, sc_off, m_off;  // in the scale area
  int64_t planes_off;   // first sub-block's planes
  int64_t sub_bytes;    // plane bytes per sub-block
  int64_t bytes;        // the whole chunk
  int64_t chunks;       // per group (K / inputs)

  ChunkLayout(const Format& f, int64_t k) {
    if (f.k_quant) {
      inputs = f.block;
    } else {  // as many blocks of 32 as keep the scale area 64-byte aligned, up to 8
      const int64_t blocks = k / f.block;
      const int64_t nb = blocks % 8 == 0 ? 8 : blocks % 4 == 0 ? 4 : blocks % 2 == 0 ? 2 : 1;
      inputs = nb * f.block;
    }
    subs = inputs / f.sub;
    const int64_t dsets = f.k_quant ? 1 : subs;  // fp16 rows of 16
    d_off = 0;
    dmin_off = d_off + dsets * kGroup * 2;
    sc_off = dmin_off + (f.stored_min ? dsets * kGroup * 2 : 0);
    m_off = sc_off + (f.k_quant ? subs * kGroup : 0);
    const int64_t scale_end = m_off + (f.k_quant && f.stored_min ? subs * kGroup : 0);
    planes_off = round64(scale_end);
    sub_bytes = plane_bytes(f.bits, f.sub);
    bytes = planes_off + subs * sub_bytes;
    chunks = k / inputs;
  }
  int64_t group_bytes() const { return chunks * bytes; }
};

// The blob's header and segment table (all little-endian int64 words).
constexpr int64_t kBlobMagic = 0x3142514c58444152;  // "RADXLQB1"
struct BlobHeader {
  int64_t magic;
  int64_t num_segments;
  int64_t n;  // output columns over all segments
  int64_t k;  // inputs
};
struct Segment {
  int64_t type;    // GgmlType
  int64_t n;       // output columns (this segment)
  int64_t offset;  // bytes from the blob's start, 64-byte aligned
  int64_t groups;  // ceil(n / 16)
};

inline int64_t blob_data_start(int64_t num_segments) {
  return round64(static_cast<int64_t>(sizeof(BlobHeader)) +
                 num_segments * static_cast<int64_t>(sizeof(Segment)));
}

// fp16 bits <-> float (exact for every fp16 value; no F16C needed at load).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    exp = 113;
    while ((mant & 0x400) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round to nearest even; overflow to infinity (the GGUF scales are fp16 already).
inline uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t abs = x & 0x7fffffff;
  if (abs >= 0x7f800000) return static_cast<uint16_t>(sign | 0x7c00 | (abs > 0x7f800000 ? 0x200 : 0));
  if (abs >= 0x477ff000) return static_cast<uint16_t>(sign | 0x7c00);  // rounds past 65504
  if (abs < 0x38800000) {  // subnormal or zero in fp16
    const float v = [&] { float t; std::memcpy(&t, &abs, 4); return t; }();
    const int32_t m = static_cast<int32_t>(__builtin_rintf(v * 16777216.0f));  // units of 2^-24
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(m));
  }
  const uint32_t rounded = abs + 0xfff + ((abs >> 13) & 1);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000) >> 13));
}

}  // namespace radixlm::quant
