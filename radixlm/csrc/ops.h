// The kernels' torch-facing entry points (one file each: attention.cpp, kv_store.cpp,
// elementwise.cpp, int8_linear.cpp, small_batch_linear.cpp, bf16_gemm.cpp,
// bf16w_gemm.cpp), which ops.cpp registers as torch.ops.radixlm.*.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <tuple>
#include <vector>

// attention.cpp (window: 0 for none; the overload without it has none)
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                           const at::Tensor& req_to_token, const at::Tensor& req_rows,
                           const at::Tensor& seq_lens, const at::Tensor& q_starts,
                           const at::Tensor& q_lens, double scale, int64_t window);
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                           const at::Tensor& req_to_token, const at::Tensor& req_rows,
                           const at::Tensor& seq_lens, const at::Tensor& q_starts,
                           const at::Tensor& q_lens, double scale);

// kv_store.cpp: K and V into the pool at slots loc, quantized where the pool is
void kv_store(at::Tensor k_buf, at::Tensor v_buf, const at::Tensor& loc, const at::Tensor& k,
              const at::Tensor& v);

// elementwise.cpp
at::Tensor silu_and_mul(const at::Tensor& x);
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps);
at::Tensor rotary_embedding(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// int8_linear.cpp
std::vector<at::Tensor> quantize_per_token(const at::Tensor& x);
std::tuple<at::Tensor, at::Tensor> quantize_per_token_op(const at::Tensor& x);
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& w_t, const at::Tensor& w_scales,
                       const c10::optional<at::Tensor>& bias);

// small_batch_linear.cpp
at::Tensor small_batch_linear(const at::Tensor& x, const at::Tensor& w,
                              const c10::optional<at::Tensor>& bias);

// bf16_gemm.cpp
bool bf16_pairs_supported();
at::Tensor pack_bf16_pairs(const at::Tensor& w);
at::Tensor bf16_pairs_linear(const at::Tensor& x, const at::Tensor& packed,
                             const c10::optional<at::Tensor>& bias);

// bf16w_gemm.cpp
bool bf16w_supported();
at::Tensor bf16w_linear(const at::Tensor& x, const at::Tensor& packed,
                        const c10::optional<at::Tensor>& bias);
