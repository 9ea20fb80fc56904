// Repacking GGUF block-quantized tensors into radixlm's layout (quant_layout.h),
// and reading that layout back: whole weights (q_dequantize: tests, fallbacks)
// and single rows (q_embedding: the token embedding lookup of a quantized table).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "quant_blocks.h"
#include "quant_layout.h"

#include <algorithm>
#include <string>
#include <vector>

namespace radixlm::quant {
namespace {

const Format& format_or_throw(int64_t type) {
  const Format* f = find_format(type);
  TORCH_CHECK(f != nullptr, "quantized weights: GGML type ", type, " is not supported here");
  return *f;
}

// Puts the levels and scales of the 16 columns of a group (L[c], zero past the last
// column) into one chunk.
void write_chunk(const Format& f, const ChunkLayout& cl, const Levels* L, uint8_t* chunk) {
  auto* d = reinterpret_cast<uint16_t*>(chunk + cl.d_off);
  auto* dmin = reinterpret_cast<uint16_t*>(chunk + cl.dmin_off);
  for (int64_t col = 0; col < kGroup; ++col) {
    if (f.k_quant) {
      d[col] = L[col].d[0];
      if (f.stored_min) dmin[col] = L[col].dmin[0];
      for (int64_t j = 0; j < cl.subs; ++j) {
        reinterpret_cast<int8_t*>(chunk + cl.sc_off)[j * kGroup + col] = L[col].sc[j];
        if (f.stored_min) chunk[cl.m_off + j * kGroup + col] = L[col].m[j];
      }
    } else {
      for (int64_t b = 0; b < cl.subs; ++b) {
        d[b * kGroup + col] = L[col].d[b];
        if (f.stored_min) dmin[b * kGroup + col] = L[col].dmin[b];
      }
    }
  }
  const int64_t quads = f.sub / 4;
  alignas(64) uint8_t b[8][64];  // one sub-block's quads: [quad][column * 4 + input]
  for (int64_t j = 0; j < cl.subs; ++j) {
    for (int64_t q = 0; q < quads; ++q) {
      for (int64_t c = 0; c < kGroup; ++c) std::memcpy(&b[q][c * 4], L[c].u + j * f.sub + q * 4, 4);
    }
    uint8_t* p = chunk + cl.planes_off + j * cl.sub_bytes;
    const auto masks = [&](uint8_t* out, int shift) {  // bit `shift` of each level, 8 bytes a quad
      for (int64_t q = 0; q < quads; ++q) {
        uint64_t m = 0;
        for (int i = 0; i < 64; ++i) m |= static_cast<uint64_t>((b[q][i] >> shift) & 1) << i;
        std::memcpy(out + q * 8, &m, 8);
      }
    };
    const auto crumbs = [&](uint8_t* out, int shift) {  // 2 bits from `shift`, 4 quads a vector
      for (int64_t v = 0; v < quads / 4; ++v) {
        for (int i = 0; i < 64; ++i) {
          uint8_t x = 0;
          for (int t = 0; t < 4; ++t) x |= static_cast<uint8_t>(((b[4 * v + t][i] >> shift) & 3) << (2 * t));
          out[v * 64 + i] = x;
        }
      }
    };
    if (f.bits == 8) {
      std::memcpy(p, b, quads * 64);
      continue;
    }
    if (f.bits >= 4) {
      for (int64_t v = 0; v < quads / 2; ++v) {
        for (int i = 0; i < 64; ++i) {
          p[v * 64 + i] = static_cast<uint8_t>((b[2 * v][i] & 15) | ((b[2 * v + 1][i] & 15) << 4));
        }
      }
      if (f.bits == 5) masks(p + quads / 2 * 64, 4);
      if (f.bits == 6) crumbs(p + quads / 2 * 64, 4);
    } else {
      crumbs(p, 0);
      if (f.bits == 3) masks(p + quads / 4 * 64, 2);
    }
  }
}

// The level of input i (in the chunk) of column col.
inline int level_at(const Format& f, const ChunkLayout& cl, const uint8_t* chunk, int64_t col,
                    int64_t i) {
  const int64_t j = i / f.sub, r = i % f.sub, q = r / 4, byte = col * 4 + r % 4;
  const int64_t quads = f.sub / 4;
  const uint8_t* p = chunk + cl.planes_off + j * cl.sub_bytes;
  const auto bit = [&](int64_t base) { return (p[base + q * 8 + byte / 8] >> (byte % 8)) & 1; };
  switch (f.bits) {
    case 8:
      return p[q * 64 + byte];
    case 4:
    case 5:
    case 6: {
      const int nib = (p[q / 2 * 64 + byte] >> (4 * (q % 2))) & 15;
      if (f.bits == 5) return nib | bit(quads / 2 * 64) << 4;
      if (f.bits == 6) return nib | ((p[quads / 2 * 64 + q / 4 * 64 + byte] >> (2 * (q % 4))) & 3) << 4;
      return nib;
    }
    default: {
      const int crumb = (p[q / 4 * 64 + byte] >> (2 * (q % 4))) & 3;
      return f.bits == 3 ? crumb | bit(quads / 4 * 64) << 2 : crumb;
    }
  }
}

// out[0..K) = column col (0..15) of a group whose data starts at `group`.
template <typename T>
void dequantize_column(const Format& f, const ChunkLayout& cl, const uint8_t* group, int64_t col,
                       T* out) {
  for (int64_t c = 0; c < cl.chunks; ++c) {
    const uint8_t* chunk = group + c * cl.bytes;
    const auto* d = reinterpret_cast<const uint16_t*>(chunk + cl.d_off);
    const auto* dmin = reinterpret_cast<const uint16_t*>(chunk + cl.dmin_off);
    for (int64_t j = 0; j < cl.subs; ++j) {
      float s, m = 0.0f;
      if (f.k_quant) {
        s = half_to_float(d[col]) * static_cast<float>(reinterpret_cast<const int8_t*>(chunk + cl.sc_off)[j * kGroup + col]);
        if (f.stored_min) m = half_to_float(dmin[col]) * static_cast<float>(chunk[cl.m_off + j * kGroup + col]);
      } else {
        s = half_to_float(d[j * kGroup + col]);
        if (f.stored_min) m = half_to_float(dmin[j * kGroup + col]);
      }
      T* o = out + c * cl.inputs + j * f.sub;
      for (int64_t i = 0; i < f.sub; ++i) {
        const int u = level_at(f, cl, chunk, col, j * f.sub + i);
        // as llama.cpp's dequantize_row_*: S * (u - c) for implied offsets, S * u - M else
        const float v = f.stored_min ? s * static_cast<float>(u) - m
                                     : s * static_cast<float>(u - f.min_mul);
        o[i] = static_cast<T>(v);
      }
    }
  }
}

struct BlobView {
  const BlobHeader* header;
  const Segment* segments;
  const uint8_t* base;
};

BlobView view_blob(const at::Tensor& blob) {
  TORCH_CHECK(blob.scalar_type() == at::kByte && blob.dim() == 1 && blob.is_contiguous() &&
                  blob.numel() >= static_cast<int64_t>(sizeof(BlobHeader)),
              "quantized weight: expected a packed uint8 blob");
  const auto* base = blob.data_ptr<uint8_t>();
  const auto* h = reinterpret_cast<const BlobHeader*>(base);
  TORCH_CHECK(h->magic == kBlobMagic, "quantized weight: not a packed blob");
  return {h, reinterpret_cast<const Segment*>(base + sizeof(BlobHeader)), base};
}

}  // namespace

// raws[i]: uint8 [n_i, row_bytes_i], one GGUF row of K inputs per output column (rows
// may be strided, a narrowed or permuted view of the file), types[i] its GGML type.
// Returns the blob: segments in order, the output columns one after another.
at::Tensor q_pack(at::TensorList raws, at::IntArrayRef types, int64_t k) {
  const int64_t num = static_cast<int64_t>(raws.size());
  TORCH_CHECK(num > 0 && static_cast<int64_t>(types.size()) == num, "q_pack: one type per tensor");
  std::vector<Segment> segs(num);
  int64_t offset = blob_data_start(num), n_total = 0;
  for (int64_t i = 0; i < num; ++i) {
    const Format& f = format_or_throw(types[i]);
    const at::Tensor& raw = raws[i];
    TORCH_CHECK(raw.scalar_type() == at::kByte && raw.dim() == 2 && raw.stride(1) == 1,
                "q_pack: raw rows as uint8 [n, row_bytes]");
    TORCH_CHECK(k % f.block == 0, "q_pack: K = ", k, " is not a multiple of the block size ",
                f.block, " of GGML type ", f.type);
    TORCH_CHECK(raw.size(1) == k / f.block * f.block_bytes, "q_pack: rows of ", raw.size(1),
                " bytes do not hold ", k, " inputs of GGML type ", f.type);
    const ChunkLayout cl(f, k);
    segs[i] = {f.type, raw.size(0), offset, (raw.size(0) + kGroup - 1) / kGroup};
    offset += round64(segs[i].groups * cl.group_bytes());
    n_total += raw.size(0);
  }
  at::Tensor blob = at::zeros({offset}, at::TensorOptions().dtype(at::kByte));
  uint8_t* base = blob.data_ptr<uint8_t>();
  *reinterpret_cast<BlobHeader*>(base) = {kBlobMagic, num, n_total, k};
  std::memcpy(base + sizeof(BlobHeader), segs.data(), num * sizeof(Segment));
  for (int64_t i = 0; i < num; ++i) {
    const Format& f = *find_format(segs[i].type);
    const ChunkLayout cl(f, k);
    const auto* src = raws[i].data_ptr<uint8_t>();
    const int64_t stride = raws[i].stride(0), n = segs[i].n;
    uint8_t* dst = base + segs[i].offset;
    at::parallel_for(0, segs[i].groups, 1, [&](int64_t g0, int64_t g1) {
      std::vector<Levels> L(kGroup);
      for (int64_t g = g0; g < g1; ++g) {
        for (int64_t c = 0; c < cl.chunks; ++c) {
          for (int64_t col = 0; col < kGroup; ++col) {
            if (g * kGroup + col < n) {
              decode_chunk(f, cl, src + (g * kGroup + col) * stride, c, L[col]);
            } else {
              L[col] = Levels{};  // padding columns: zero levels and scales
            }
          }
          write_chunk(f, cl, L.data(), dst + g * cl.group_bytes() + c * cl.bytes);
        }
      }
    });
  }
  return blob;
}

// The whole weight [N, K] as float32 (the values llama.cpp's dequantize_row_* gives).
at::Tensor q_dequantize(const at::Tensor& blob) {
  const BlobView b = view_blob(blob);
  const int64_t k = b.header->k;
  at::Tensor out = at::empty({b.header->n, k}, at::TensorOptions().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  int64_t row0 = 0;
  for (int64_t i = 0; i < b.header->num_segments; ++i) {
    const Segment& s = b.segments[i];
    const Format& f = format_or_throw(s.type);
    const ChunkLayout cl(f, k);
    at::parallel_for(0, s.n, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        dequantize_column(f, cl, b.base + s.offset + r / kGroup * cl.group_bytes(), r % kGroup,
                          o + (row0 + r) * k);
      }
    });
    row0 += s.n;
  }
  return out;
}

// Rows ids [T] of the weight [N, K] (an embedding table) -> [T, K] float32 or bfloat16.
at::Tensor q_embedding(const at::Tensor& blob, const at::Tensor& ids, bool bf16) {
  const BlobView b = view_blob(blob);
  const int64_t k = b.header->k, n = b.header->n;
  const at::Tensor idc = ids.to(at::kLong).contiguous();
  const int64_t t = idc.numel();
  at::Tensor out = at::empty({t, k}, at::TensorOptions().dtype(bf16 ? at::kBFloat16 : at::kFloat));
  const int64_t* id = idc.data_ptr<int64_t>();
  for (int64_t i = 0; i < t; ++i) {
    TORCH_CHECK(id[i] >= 0 && id[i] < n, "q_embedding: id ", id[i], " outside [0, ", n, ")");
  }
  at::parallel_for(0, t, 4, [&](int64_t i0, int64_t i1) {
    std::vector<float> row(k);
    for (int64_t i = i0; i < i1; ++i) {
      int64_t r = id[i], seg = 0;
      while (r >= b.segments[seg].n) r -= b.segments[seg++].n;
      const Segment& s = b.segments[seg];
      const Format& f = *find_format(s.type);
      const ChunkLayout cl(f, k);
      const uint8_t* group = b.base + s.offset + r / kGroup * cl.group_bytes();
      if (bf16) {
        dequantize_column(f, cl, group, r % kGroup, row.data());
        auto* o = out.data_ptr<c10::BFloat16>() + i * k;
        for (int64_t j = 0; j < k; ++j) o[j] = c10::BFloat16(row[j]);
      } else {
        dequantize_column(f, cl, group, r % kGroup, out.data_ptr<float>() + i * k);
      }
    }
  });
  return out;
}

// [num_segments, 4]: (GGML type, n, byte offset, groups) per segment, then N and K.
std::vector<int64_t> q_blob_info(const at::Tensor& blob) {
  const BlobView b = view_blob(blob);
  std::vector<int64_t> out{b.header->n, b.header->k, b.header->num_segments};
  for (int64_t i = 0; i < b.header->num_segments; ++i) {
    out.push_back(b.segments[i].type);
    out.push_back(b.segments[i].n);
  }
  return out;
}

// Whether radixlm runs this GGML type quantized.
bool q_supported(int64_t type) { return find_format(type) != nullptr; }

}  // namespace radixlm::quant

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("q_pack(Tensor[] raws, int[] types, int k) -> Tensor");
  m.def("q_dequantize(Tensor blob) -> Tensor");
  m.def("q_embedding(Tensor blob, Tensor ids, bool bf16) -> Tensor");
  m.def("q_blob_info(Tensor blob) -> int[]");
  m.def("q_supported(int type) -> bool", &radixlm::quant::q_supported);
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) {
  m.impl("q_pack", &radixlm::quant::q_pack);
  m.impl("q_dequantize", &radixlm::quant::q_dequantize);
  m.impl("q_embedding", &radixlm::quant::q_embedding);
  m.impl("q_blob_info", &radixlm::quant::q_blob_info);
}
