// The decoder layers of a model in one call: the interpreter of the layer program
// each layer declares in Python (models/layer_program.py, whose docstring is the
// contract; models/layer_stack.py encodes the programs and decides when a step
// may come here).
//
// The Python loop over layers spends ~150 us a layer outside the kernels (module
// calls, argument checks, ~15 operator calls from Python): with 30 layers ~5 ms of
// a 17 ms one-request bf16 decode step. Here each instruction calls the kernel or
// the torch operators its Python twin calls in the same case (layer_ops.h), in the
// same order, so the result is the Python loop's bit for bit at a fraction of the
// overhead. A family's layer is data here: a new family needs new C++ only where
// it needs a new kernel (a new instruction).
//
// An instruction is kWidth int64s: opcode, two output registers, three input
// registers, six parameters (tensor, float or rope-table indices and sizes).
// Registers hold tensors: 0 the hidden state, 1 the residual stream (undefined
// before the first layer's input norm), the rest a layer's temporaries, cleared
// at each kEndLayer.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <torch/library.h>

#include "layer_ops.h"
#include "ops.h"  // paged_attention, kv_store
#include "prepared_linear.h"

#include <tuple>
#include <vector>


namespace {

namespace ops = radixlm::layer_ops;

// layer_program.py's Opcode.
enum Opcode : int64_t {
  kNorm = 0,       // out0 = rms_norm(in0; tensors[p0], floats[p1])
  kAddNorm = 1,    // (out0, out1) = add_and_norm(in0, out1; tensors[p0], floats[p1]); out1
                   // undefined: out1 = in0, out0 = rms_norm(in0)
  kLinear = 2,     // out0 = prepared_linear(in0; tensors[p0], biases[p0], kinds[p0])
  kColumns = 3,    // out0 = in0[:, p0 : p0 + p1], viewed [T, -1, p2] where p2 > 0
  kHeads = 4,      // out0 = in0[:, p0 : p0 + p1] of [T, n, D]
  kRope = 5,       // out0 = rotate(in0; ropes[2 p0], ropes[2 p0 + 1])
  kAttention = 6,  // out0 = attention(in0, in1, in2; layer p0, scale floats[p1],
                   // window p2 (-1: none), softcap floats[p3] (p3 -1: none; refused))
  kGatedAct = 7,   // out0 = gated_act(in0; activation p0)
  kMoe = 8,        // out0 = moe(in0; router tensors[p0], experts' gate_up tensors[p1 ..
                   // p1 + p2), down [p1 + p2 .. p1 + 2 p2), top_k p3, norm_topk_prob p4,
                   // activation p5)
  kAdd = 9,        // out0 = in0 + in1
  kEndLayer = 10,  // clear the temporaries
};
constexpr int64_t kWidth = 12;
constexpr int64_t kHidden = 0, kResidual = 1;

struct Instr {
  int64_t op, out0, out1, in0, in1, in2, p[6];
};
static_assert(sizeof(Instr) == kWidth * sizeof(int64_t), "Instr is kWidth int64s");

// The step's attention arguments (layer_stack.py: LayerStack.run's attn_step), which
// grow as the attention kernels do.
struct AttnStep {
  const at::Tensor &out_cache_loc, &req_to_token, &req_rows, &seq_lens, &q_starts, &q_lens;
};

// CpuPagedAttnBackend.forward for a step whose rows are all in the kernel: K and V
// into the pool (quantized where the pool is: --kv-cache-dtype int8/fp8, which the
// paged kernel reads as stored), then paged attention under the layer's sliding
// window (window < 0: none); [T, H * D].
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     at::Tensor k_buf, at::Tensor v_buf, const AttnStep& step, double scale,
                     int64_t window, bool softcap) {
  TORCH_CHECK(!softcap, "layer_program: the paged attention kernel has no logit softcap");
  kv_store(k_buf, v_buf, step.out_cache_loc, k, v);  // TokenToKVPool.set_kv_buffer's store
  RECORD_FUNCTION("radixlm::paged_attention", std::vector<c10::IValue>());
  return paged_attention(q, k_buf, v_buf, step.req_to_token, step.req_rows, step.seq_lens,
                         step.q_starts, step.q_lens, scale, window < 0 ? 0 : window)  // (0: none)
      .view({q.size(0), -1});
}

// hidden [T, hidden]; ropes: (cos, sin) per rotary table, each [T, 1, R / 2] in
// hidden's dtype; code: the instructions of every layer, int64 [n * kWidth]; floats:
// float64 [f]; tensors (norm weights and prepared linear weights), kinds (int64 [t])
// and biases (per tensor: PreparedWeight.cpp_kind and bias for linear weights);
// k_bufs, v_bufs: the pool's, by layer id; attn_step: out_cache_loc, req_to_token,
// req_rows, seq_lens, q_starts, q_lens. Writes each layer's K and V at out_cache_loc
// and returns (hidden, residual) after the last layer, which the final norm adds.
// (code, floats and kinds are tensors: a list of thousands of ints would be converted
// from Python at every call.)
std::tuple<at::Tensor, at::Tensor> layer_program(
    const at::Tensor& hidden, at::TensorList ropes, const at::Tensor& code_t, int64_t num_regs,
    const at::Tensor& floats_t, at::TensorList tensors, const at::Tensor& kinds_t,
    const c10::List<c10::optional<at::Tensor>>& biases, at::TensorList k_bufs,
    at::TensorList v_bufs, at::TensorList attn_step, bool fused) {
  const int64_t num_tensors = static_cast<int64_t>(tensors.size());
  TORCH_CHECK(code_t.scalar_type() == at::kLong && code_t.is_contiguous() &&
                  code_t.numel() % kWidth == 0 && num_regs >= 2,
              "layer_program: malformed code");
  TORCH_CHECK(floats_t.scalar_type() == at::kDouble && floats_t.is_contiguous() &&
                  kinds_t.scalar_type() == at::kLong && kinds_t.is_contiguous(),
              "layer_program: floats float64, kinds int64");
  TORCH_CHECK(kinds_t.numel() == num_tensors && static_cast<int64_t>(biases.size()) == num_tensors,
              "layer_program: a kind and a bias per tensor");
  const double* floats = floats_t.data_ptr<double>();
  const at::IntArrayRef kinds(kinds_t.data_ptr<int64_t>(), num_tensors);
  TORCH_CHECK(attn_step.size() == 6, "layer_program: six attention step arguments");
  TORCH_CHECK(hidden.dim() == 2, "layer_program: hidden [T, hidden]");
  const AttnStep step{attn_step[0], attn_step[1], attn_step[2],
                      attn_step[3], attn_step[4], attn_step[5]};
  std::vector<at::Tensor> regs(num_regs);
  regs[kHidden] = hidden;
  const auto* program = reinterpret_cast<const Instr*>(code_t.data_ptr<int64_t>());
  const int64_t length = code_t.numel() / kWidth;
  for (int64_t i = 0; i < length; ++i) {
    const Instr& in = program[i];
    const int64_t* p = in.p;
    switch (in.op) {
      case kNorm:
        regs[in.out0] = ops::rms_norm(regs[in.in0], tensors[p[0]], floats[p[1]]);
        break;
      case kAddNorm:
        if (!regs[in.out1].defined()) {
          regs[in.out1] = regs[in.in0];
          regs[in.out0] = ops::rms_norm(regs[in.in0], tensors[p[0]], floats[p[1]]);
        } else {
          std::tie(regs[in.out0], regs[in.out1]) =
              ops::add_and_norm(regs[in.in0], regs[in.out1], tensors[p[0]], floats[p[1]], fused);
        }
        break;
      case kLinear:
        regs[in.out0] = radixlm::prepared_linear(regs[in.in0], tensors[p[0]], biases.get(p[0]),
                                                 kinds[p[0]]);
        break;
      case kColumns: {
        const at::Tensor cols = regs[in.in0].narrow(1, p[0], p[1]);
        regs[in.out0] = p[2] > 0 ? cols.view({cols.size(0), -1, p[2]}) : cols;
        break;
      }
      case kHeads:
        regs[in.out0] = regs[in.in0].narrow(1, p[0], p[1]);
        break;
      case kRope:
        regs[in.out0] = ops::rotate(regs[in.in0], ropes[2 * p[0]], ropes[2 * p[0] + 1], fused);
        break;
      case kAttention:
        regs[in.out0] = attention(regs[in.in0], regs[in.in1], regs[in.in2], k_bufs[p[0]],
                                  v_bufs[p[0]], step, floats[p[1]], p[2], p[3] >= 0);
        break;
      case kGatedAct:
        regs[in.out0] = ops::gated_act(regs[in.in0], p[0], fused);
        break;
      case kMoe: {
        const at::Tensor& x = regs[in.in0];
        const at::Tensor logits =
            radixlm::prepared_linear(x, tensors[p[0]], biases.get(p[0]), kinds[p[0]]);
        const int64_t e = p[2];
        RECORD_FUNCTION("radixlm::moe_experts", std::vector<c10::IValue>());
        regs[in.out0] = ops::moe_experts(x, logits, p[3], p[4] != 0, tensors.slice(p[1], e),
                                         tensors.slice(p[1] + e, e), kinds.slice(p[1], e),
                                         kinds.slice(p[1] + e, e), p[5], fused);
        break;
      }
      case kAdd:
        regs[in.out0] = regs[in.in0] + regs[in.in1];
        break;
      case kEndLayer:
        for (int64_t r = kResidual + 1; r < num_regs; ++r) {
          regs[r].reset();
        }
        break;
      default:
        TORCH_CHECK(false, "layer_program: unknown opcode ", in.op);
    }
  }
  return {regs[kHidden], regs[kResidual]};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def(
      "layer_program(Tensor hidden, Tensor[] ropes, Tensor code, int num_regs, Tensor floats, "
      "Tensor[] tensors, Tensor kinds, Tensor?[] biases, Tensor(a!)[] k_bufs, "
      "Tensor(b!)[] v_bufs, Tensor[] attn_step, bool fused) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("layer_program", &layer_program); }
// oneDNN-packed weights are tensors of the MkldnnCPU backend, which then picks the kernel.
TORCH_LIBRARY_IMPL(radixlm, MkldnnCPU, m) { m.impl("layer_program", &layer_program); }
