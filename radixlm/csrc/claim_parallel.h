// Parallel loops whose threads take over the work of a descheduled sibling.
//
// at::parallel_for hands each thread one fixed range. On a machine where another
// process (the HTTP front end, a benchmark client, the hypervisor) takes a core
// for a few milliseconds, the thread on that core finishes its range that much
// later while its sibling waits at the region's end: on 2 cores beside a process
// that keeps 30% of one busy, all linear layers of a decode step at 32 rows took
// 2x as long. Here each thread still starts on its own contiguous range (so
// neighbouring items stay on one core, and a kernel may prefetch the next one),
// but items are claimed one at a time from an atomic cursor, and a thread that
// has finished its range claims what is left of the others'. A late thread then
// finds its range done and only has to check in at the barrier.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace radixlm {

// body(item, range_end) for every item in [0, n), each exactly once; range_end
// is the end of the range the item was claimed from (item + 1 < range_end: the
// next item is likely to run on this thread next, so prefetching it pays).
//
// Each range is one atomic word, [lo, hi) as two 32-bit halves: its owner claims
// from the front, a thread done with its own range from the back, so the two work
// apart until they meet.
template <typename Body>
void claim_parallel(int64_t n, const Body& body) {
  if (n <= 0) return;
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), n);
  if (threads <= 1 || at::in_parallel_region() || n >= (int64_t{1} << 31)) {
    for (int64_t i = 0; i < n; ++i) body(i, n);
    return;
  }
  struct alignas(64) Range {
    std::atomic<uint64_t> span;  // lo | hi << 32
  };
  const auto pack = [](uint64_t lo, uint64_t hi) { return lo | hi << 32; };
  std::unique_ptr<Range[]> ranges(new Range[threads]);
  for (int64_t r = 0; r < threads; ++r) {
    ranges[r].span.store(pack(r * n / threads, (r + 1) * n / threads), std::memory_order_relaxed);
  }
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t own = begin; own < end; ++own) {
      std::atomic<uint64_t>& mine = ranges[own].span;
      for (uint64_t s = mine.load(std::memory_order_relaxed);;) {
        const uint64_t lo = s & 0xffffffffu, hi = s >> 32;
        if (lo >= hi) break;
        if (mine.compare_exchange_weak(s, pack(lo + 1, hi), std::memory_order_relaxed)) {
          body(static_cast<int64_t>(lo), static_cast<int64_t>(hi));
          s = mine.load(std::memory_order_relaxed);
        }
      }
      for (int64_t k = 1; k < threads; ++k) {  // then the others' ranges, from their ends
        std::atomic<uint64_t>& theirs = ranges[(own + k) % threads].span;
        for (uint64_t s = theirs.load(std::memory_order_relaxed);;) {
          const uint64_t lo = s & 0xffffffffu, hi = s >> 32;
          if (lo >= hi) break;
          if (theirs.compare_exchange_weak(s, pack(lo, hi - 1), std::memory_order_relaxed)) {
            body(static_cast<int64_t>(hi - 1), static_cast<int64_t>(hi - 1));
            s = theirs.load(std::memory_order_relaxed);
          }
        }
      }
    }
  });
}

}  // namespace radixlm
