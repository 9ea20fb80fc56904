// GGUF blocks (ggml-common.h's block_q4_0 .. block_q6_K) decoded into the levels
// and scales of quant_layout.h: unsigned levels u and, per sub-block, the raw
// fp16 scale bits and int sub-scales, so that w = S * u - M exactly as llama.cpp's
// dequantize_row_* computes it.
#pragma once

#include "quant_layout.h"

#include <cstdint>
#include <cstring>

namespace radixlm::quant {

struct Levels {
  uint8_t u[256];
  uint16_t d[8];     // legacy: S per block of 32 (fp16 bits); K-quants: d in d[0]
  uint16_t dmin[8];  // legacy: M per block (fp16 bits, M = -m); K-quants: dmin in dmin[0]
  int8_t sc[16];     // K-quants: per sub-block
  uint8_t m[16];     // K-quants with stored offsets: per sub-block
};

inline uint16_t load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Q4_K / Q5_K: the 12 bytes of 6-bit scales and mins (get_scale_min_k4).
inline void unpack_k4_scales(const uint8_t* q, int8_t* sc, uint8_t* m) {
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      sc[j] = static_cast<int8_t>(q[j] & 63);
      m[j] = q[j + 4] & 63;
    } else {
      sc[j] = static_cast<int8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
      m[j] = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
  }
}

// One legacy block of 32 (blk) into levels u[32] and d/dmin[slot].
inline void decode_legacy(int32_t type, const uint8_t* blk, uint8_t* u, uint16_t* d,
                          uint16_t* dmin) {
  *d = load16(blk);
  switch (type) {
    case kQ4_0:
      for (int j = 0; j < 16; ++j) u[j] = blk[2 + j] & 0xF, u[j + 16] = blk[2 + j] >> 4;
      break;
    case kQ4_1:
      *dmin = load16(blk + 2) ^ 0x8000;  // M = -m
      for (int j = 0; j < 16; ++j) u[j] = blk[4 + j] & 0xF, u[j + 16] = blk[4 + j] >> 4;
      break;
    case kQ5_0:
    case kQ5_1: {
      const int off = type == kQ5_0 ? 2 : 4;
      if (type == kQ5_1) *dmin = load16(blk + 2) ^ 0x8000;
      uint32_t qh;
      std::memcpy(&qh, blk + off, 4);
      const uint8_t* qs = blk + off + 4;
      for (int j = 0; j < 16; ++j) {
        u[j] = static_cast<uint8_t>((qs[j] & 0xF) | (((qh >> j) & 1) << 4));
        u[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
      }
      break;
    }
    default:  // kQ8_0: u = q + 128
      for (int j = 0; j < 32; ++j) u[j] = static_cast<uint8_t>(static_cast<int8_t>(blk[2 + j]) + 128);
      break;
  }
}

// One K-quant super-block of 256 into L (u, d[0], dmin[0], sc, m).
inline void decode_k(int32_t type, const uint8_t* b, Levels& L) {
  switch (type) {
    case kQ2_K: {  // scales[16], qs[64], d, dmin
      for (int j = 0; j < 16; ++j) L.sc[j] = static_cast<int8_t>(b[j] & 0xF), L.m[j] = b[j] >> 4;
      L.d[0] = load16(b + 80), L.dmin[0] = load16(b + 82);
      const uint8_t* q = b + 16;
      for (int n = 0, y = 0; n < 2; ++n, q += 32) {
        for (int shift = 0; shift < 8; shift += 2) {
          for (int l = 0; l < 32; ++l) L.u[y + l] = (q[l] >> shift) & 3;
          y += 32;
        }
      }
      break;
    }
    case kQ3_K: {  // hmask[32], qs[64], scales[12], d
      const uint8_t* hm = b;
      const uint8_t* q = b + 32;
      uint32_t aux[4];
      std::memcpy(aux, b + 96, 12);
      const uint32_t k1 = 0x03030303, k2 = 0x0f0f0f0f, tmp = aux[2];
      aux[2] = ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4);
      aux[3] = ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4);
      aux[0] = (aux[0] & k2) | (((tmp >> 0) & k1) << 4);
      aux[1] = (aux[1] & k2) | (((tmp >> 2) & k1) << 4);
      const auto* s = reinterpret_cast<const uint8_t*>(aux);
      for (int j = 0; j < 16; ++j) L.sc[j] = static_cast<int8_t>(s[j] - 32);
      L.d[0] = load16(b + 108);
      uint8_t mask = 1;
      for (int n = 0, y = 0; n < 2; ++n, q += 32) {
        for (int shift = 0; shift < 8; shift += 2, mask <<= 1) {
          // level = low 2 bits + 4 * high bit; w = S * (level - 4)
          for (int l = 0; l < 32; ++l) {
            L.u[y + l] = static_cast<uint8_t>(((q[l] >> shift) & 3) | ((hm[l] & mask) ? 4 : 0));
          }
          y += 32;
        }
      }
      break;
    }
    case kQ4_K:
    case kQ5_K: {  // d, dmin, scales[12], (qh[32]), qs[128]
      L.d[0] = load16(b), L.dmin[0] = load16(b + 2);
      unpack_k4_scales(b + 4, L.sc, L.m);
      const bool five = type == kQ5_K;
      const uint8_t* qh = b + 16;
      const uint8_t* q = b + (five ? 48 : 16);
      for (int j = 0, y = 0; j < 4; ++j, q += 32) {
        for (int l = 0; l < 32; ++l) {
          const int hi0 = five ? ((qh[l] >> (2 * j)) & 1) << 4 : 0;
          const int hi1 = five ? ((qh[l] >> (2 * j + 1)) & 1) << 4 : 0;
          L.u[y + l] = static_cast<uint8_t>((q[l] & 0xF) | hi0);
          L.u[y + 32 + l] = static_cast<uint8_t>((q[l] >> 4) | hi1);
        }
        y += 64;
      }
      break;
    }
    default: {  // kQ6_K: ql[128], qh[64], scales[16], d
      const uint8_t* ql = b;
      const uint8_t* qh = b + 128;
      std::memcpy(L.sc, b + 192, 16);
      L.d[0] = load16(b + 208);
      for (int n = 0; n < 2; ++n, ql += 64, qh += 32) {
        uint8_t* y = L.u + 128 * n;
        for (int l = 0; l < 32; ++l) {
          y[l] = static_cast<uint8_t>((ql[l] & 0xF) | ((qh[l] & 3) << 4));
          y[l + 32] = static_cast<uint8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
          y[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
          y[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
        }
      }
      break;
    }
  }
}

// The levels of one chunk (ChunkLayout.inputs values) of one GGUF row.
inline void decode_chunk(const Format& f, const ChunkLayout& cl, const uint8_t* row, int64_t chunk,
                         Levels& L) {
  if (f.k_quant) {
    decode_k(f.type, row + chunk * f.block_bytes, L);
    return;
  }
  const int64_t blocks = cl.inputs / f.block;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = row + (chunk * blocks + b) * f.block_bytes;
    decode_legacy(f.type, blk, L.u + 32 * b, &L.d[b], &L.dmin[b]);
  }
}

}  // namespace radixlm::quant
