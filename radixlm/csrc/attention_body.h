// Paged attention, one level's copy (an ISA body, see isa.h; attention.cpp
// instantiates it and holds the torch-facing glue).
//
// Attention over K/V read in place from the paged pool through each request's
// row of the slot table (no gather copy). Up to kRowwiseMaxRows new rows a request
// (a decode's one, a speculative step's 1 + K): each (request, KV head) task
// streams its keys once, scores every query row of the group against them, then
// streams the values once (attention_decode_body.h). Longer extends (prefill
// chunks): blocked flash attention, kQBlock query rows x kKBlock keys, online
// softmax (attention_flash_body.h). K/V rows in any of the pool's formats
// (kv_format.h), converted in registers (attention_kv_body.h); a sliding window
// bounds the keys each task reads.
namespace {

#include "vec_body.h"
#include "attention_kv_body.h"
#include "attention_decode_body.h"
#include "attention_flash_body.h"

// One unit of parallel work: request b, KV head h, query rows row0 .. row0 + nrows
// (nrows = 0: all of them, through attend_group).
struct AttnTask {
  int64_t b, h, row0, nrows;
};

// Tasks of the batch, ordered so that contiguous halves cost about the same: a
// request's blocks alternate from its first and last (causal cost grows with the
// row), since claim_parallel starts each thread on one contiguous range.
inline bool has_block_kernel(int64_t head_dim) { return head_dim == 64 || head_dim == 128; }

// A task's query rows: kQBlock, or more where the KV head serves fewer query heads,
// so that each key block (converted once per task) serves kScoreRows score rows.
inline int64_t task_query_rows(int64_t group) {
  return std::max<int64_t>(kQBlock, kScoreRows / std::max<int64_t>(group, 1));
}

inline std::vector<AttnTask> attention_tasks(int64_t batch, int64_t num_kv_heads, int64_t group,
                                             int64_t head_dim, const int64_t* qlens) {
  const int64_t q_block = task_query_rows(group);
  std::vector<AttnTask> tasks;
  for (int64_t b = 0; b < batch; ++b) {
    if (qlens[b] <= kRowwiseMaxRows || !has_block_kernel(head_dim)) {
      for (int64_t h = 0; h < num_kv_heads; ++h) tasks.push_back({b, h, 0, 0});
      continue;
    }
    const int64_t blocks = (qlens[b] + q_block - 1) / q_block;
    const auto add = [&](int64_t blk) {
      const int64_t row0 = blk * q_block;
      for (int64_t h = 0; h < num_kv_heads; ++h) {
        tasks.push_back({b, h, row0, std::min(q_block, qlens[b] - row0)});
      }
    };
    for (int64_t lo = 0, hi = blocks - 1; lo <= hi; ++lo, --hi) {
      add(lo);
      if (hi != lo) add(hi);
    }
  }
  return tasks;
}

template <typename qT, typename kvT>
void paged_attention_typed(const PagedAttentionArgs& a) {
  const int64_t num_heads = a.num_heads, head_dim = a.head_dim, q_row_stride = a.q_row_stride;
  const auto* q_ptr = static_cast<const qT*>(a.q);
  auto* out_ptr = static_cast<qT*>(a.out);
  const auto* k_ptr = static_cast<const kvT*>(a.k_buf);
  const auto* v_ptr = static_cast<const kvT*>(a.v_buf);
  const int64_t *rows = a.req_rows, *lens = a.seq_lens, *starts = a.q_starts, *qlens = a.q_lens;
  const std::vector<AttnTask> tasks =
      attention_tasks(a.batch, a.num_kv_heads, a.num_heads / a.num_kv_heads, head_dim, qlens);
  const auto attend = head_dim == 64    ? &attend_group_vec<64, qT, kvT>
                      : head_dim == 128 ? &attend_group_vec<128, qT, kvT>
                                        : &attend_group<qT, kvT>;
  const auto attend_rows = head_dim == 64 ? &attend_block<64, qT, kvT>
                                          : &attend_block<128, qT, kvT>;
  radixlm::claim_parallel(static_cast<int64_t>(tasks.size()), [&](int64_t t, int64_t) {
    // Each thread's scratch, kept between tasks and calls (grown to the longest).
    thread_local std::vector<float> qf, scores, acc;
    thread_local BlockScratch scratch;
    const AttnTask& task = tasks[t];
    const int64_t b = task.b;
    const qT* q_req = q_ptr + starts[b] * q_row_stride;
    qT* out_req = out_ptr + starts[b] * num_heads * head_dim;
    const int64_t* slots = a.req_to_token + rows[b] * a.table_stride;
    const KvRows<kvT> kv{k_ptr + task.h * a.row_width, v_ptr + task.h * a.row_width,
                         a.num_kv_heads * a.row_width, a.row_width};
    if (task.nrows == 0) {
      attend(q_req, q_row_stride, out_req, kv, slots, lens[b], qlens[b], task.h, num_heads,
             a.num_kv_heads, head_dim, a.scale, a.window, qf, scores, acc);
    } else {
      attend_rows(q_req, q_row_stride, out_req, kv, slots, lens[b], qlens[b], task.row0,
                  task.nrows, task.h, num_heads, a.num_kv_heads, a.scale, a.window, scratch);
    }
  });
}

template <typename qT>
void paged_attention_kv(const PagedAttentionArgs& a) {
  switch (a.kv_dtype) {
    case c10::ScalarType::Float:
      return paged_attention_typed<qT, float>(a);
    case c10::ScalarType::BFloat16:
      return paged_attention_typed<qT, c10::BFloat16>(a);
    case c10::ScalarType::Half:
      return paged_attention_typed<qT, c10::Half>(a);
    case c10::ScalarType::Char:
      return paged_attention_typed<qT, int8_t>(a);
    case c10::ScalarType::Float8_e4m3fn:
      return paged_attention_typed<qT, KvE4m3>(a);
    default:  // Float8_e5m2 (attention.cpp admits these six)
      return paged_attention_typed<qT, KvE5m2>(a);
  }
}

// The level's entry (attention.cpp checks the arguments and the dtypes first).
void paged_attention_kernel(const PagedAttentionArgs& a) {
  switch (a.q_dtype) {
    case c10::ScalarType::Float:
      return paged_attention_kv<float>(a);
    case c10::ScalarType::BFloat16:
      return paged_attention_kv<c10::BFloat16>(a);
    default:
      return paged_attention_kv<c10::Half>(a);
  }
}

}  // namespace
