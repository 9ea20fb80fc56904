// The tile loop of the two kernels over bf16 pairs-packed weights (bf16_gemm.cpp:
// bf16 arithmetic; bf16w_gemm.cpp: float32 over bf16 weights).
//
// A packed weight is `groups` groups of 16 output columns (pack_bf16_pairs). The
// threads claim column tiles of kTileGroups groups (claim_parallel.h), and each
// tile runs over the rows at most kRowsMax at a time, so the tile's weight stays in L2
// while every row tile uses it; the first row tile fetches the next tile's weight
// meanwhile. A kernel's tile function is a template over its row and group counts
// (accumulators in registers); `with_count` turns the run-time counts into those.
#pragma once

#include <c10/util/Exception.h>

#include "claim_parallel.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace radixlm {

// f(std::integral_constant<int64_t, n>{}) for n in [kFrom, kMax].
template <int64_t kMax, int64_t kFrom = 1, typename F>
inline void with_count(int64_t n, const F& f) {
  if (n == kFrom) return f(std::integral_constant<int64_t, kFrom>{});
  if constexpr (kFrom < kMax) {
    return with_count<kMax, kFrom + 1>(n, f);
  } else {
    TORCH_CHECK(false, "pairs tile of ", n, " (at most ", kMax, ")");
  }
}

// out [m, groups * 16] <- x [m, K] w^T + bias for a packed weight w (32-bit pair
// words, pairs = K / 2 of them a column group). tile(rows, groups_in_tile, x_tile,
// x_stride, w_tile, group_stride, pairs, bias_tile or null, out_tile, out_stride,
// next) computes one tile, rows and groups_in_tile as std::integral_constant; next
// is the next tile's weight when this thread is likely to take it next (for a
// prefetch), else null.
template <int64_t kTileGroups, int64_t kRowsMax, typename XT, typename OT, typename Tile>
void for_each_tile(const XT* x, int64_t x_stride, int64_t m, const uint32_t* w, int64_t groups,
                   int64_t pairs, const OT* bias, OT* out, const Tile& tile) {
  constexpr int64_t kGroup = 16;
  const int64_t n = groups * kGroup, group_stride = pairs * kGroup;
  const int64_t tiles = (groups + kTileGroups - 1) / kTileGroups;
  if (m == 0) return;  // (a chunk whose logits nobody asked for)
  claim_parallel(tiles, [&](int64_t t, int64_t range_end) {
    const int64_t g0 = t * kTileGroups, ng = std::min(kTileGroups, groups - g0);
    const uint32_t* wt = w + g0 * group_stride;
    // The next tile's groups that exist (a last partial tile: its first groups).
    const uint32_t* next = t + 1 < range_end && g0 + 2 * kTileGroups <= groups
                               ? wt + kTileGroups * group_stride
                               : nullptr;
    const OT* bt = bias != nullptr ? bias + g0 * kGroup : nullptr;
    // Row tiles of equal size (16 rows with kRowsMax 5: 4 x 4, not 5 + 5 + 5 + 1,
    // whose one-row tile waits on its FMA chain at almost the cost of a full one).
    const int64_t row_tiles = (m + kRowsMax - 1) / kRowsMax;
    const int64_t tile_rows = (m + row_tiles - 1) / row_tiles;
    for (int64_t r0 = 0; r0 < m; r0 += tile_rows) {
      with_count<kTileGroups>(ng, [&](auto g) {
        with_count<kRowsMax>(std::min(tile_rows, m - r0), [&](auto r) {
          tile(r, g, x + r0 * x_stride, x_stride, wt, group_stride, pairs, bt,
               out + r0 * n + g0 * kGroup, n, r0 == 0 ? next : nullptr);
        });
      });
    }
  });
}

}  // namespace radixlm
