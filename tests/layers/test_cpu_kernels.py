"""The CPU kernels against torch references: paged attention (cpu_paged backend vs
torch_native, mixed batches of decodes, short and long extends with cached prefixes, GQA,
float32 and bfloat16 pools), the W8A8 int8 linear (vs the same math in torch ops), and the
fused silu_and_mul / add_rms_norm passes (vs torch's operators), each at every ISA level
the CPU has (the isa_level fixture, tests/_kernels.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from _kernels import KERNELS_MISSING, requires_kernels

from radixlm.layers.attention import create_attention_backend
from radixlm.layers.cpu_gemm import Int8Weight, int8_linear
from radixlm.layers.cpu_kernels import load_cpu_kernels
from radixlm.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixlm.model_executor.forward_batch import ForwardBatch

pytestmark = requires_kernels()

H, HKV = 6, 2


def _batch(pool: TokenToKVPool, rows: ReqToTokenPool, prefix_lens: list[int],
           extend_lens: list[int], backend_name: str) -> ForwardBatch:
    """A batch over requests whose first prefix_lens[i] tokens are already in the pool."""
    locs, req_rows = [], []
    for prefix, extend in zip(prefix_lens, extend_lens):
        row = rows.alloc()
        assert row is not None
        slots = pool.alloc(prefix + extend)
        assert slots is not None
        rows.req_to_token[row, : prefix + extend] = slots
        locs.append(slots[prefix:])
        req_rows.append(row)
    num_tokens = sum(extend_lens)
    return ForwardBatch(
        input_ids=torch.zeros(num_tokens, dtype=torch.int64),
        positions=torch.zeros(num_tokens, dtype=torch.int64),
        out_cache_loc=torch.cat(locs),
        req_pool_indices=torch.tensor(req_rows),
        req_to_token=rows.req_to_token,
        token_to_kv_pool=pool,
        prefix_lens=prefix_lens,
        extend_lens=extend_lens,
        attn_backend=create_attention_backend(backend_name),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    ("prefix_lens", "extend_lens"),
    [
        ([7, 0, 30, 1], [1, 1, 1, 1]),  # decodes (one with an empty prefix)
        ([5, 40, 0, 12], [1, 4, 9, 40]),  # decodes, 1 + K rows, a fresh prefill, a long extend
        ([50], [37]),  # one long chunk after a cached prefix (the split flash path)
        ([0], [33]),  # one fresh prefill (plain causal)
        # the kernel's blocked path (head dims 64, 128): several query blocks of 64 rows,
        # several key blocks, partial last blocks, beside decodes and a short extend
        ([130, 3, 0], [200, 1, 7]),
        ([0], [150]),
    ],
    ids=["decode", "mixed", "chunk-after-prefix", "fresh-prefill", "long-mixed", "long-fresh"],
)
@pytest.mark.parametrize("head_dim", [16, 64, 128])
def test_paged_backend_equals_torch_native(
    dtype: torch.dtype, prefix_lens: list[int], extend_lens: list[int], head_dim: int,
    isa_level: str,
) -> None:
    torch.manual_seed(0)
    pool = TokenToKVPool(1024, 1, HKV, head_dim, dtype, "cpu")
    pool.k_buffers[0].normal_()
    pool.v_buffers[0].normal_()
    outs = {}
    num_tokens = sum(extend_lens)
    q = torch.randn(num_tokens, H + HKV, head_dim).to(dtype)[:, :H]  # a strided view, as the model has
    k = torch.randn(num_tokens, HKV, head_dim).to(dtype)
    v = torch.randn(num_tokens, HKV, head_dim).to(dtype)
    for name in ("torch_native", "cpu_paged"):
        pool.clear()
        rows = ReqToTokenPool(8, 512, "cpu")
        batch = _batch(pool, rows, prefix_lens, extend_lens, name)
        assert batch.attn_backend is not None
        batch.attn_backend.init_forward_metadata(batch)
        outs[name] = batch.attn_backend.forward(q, k, v, 0, batch).float()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(outs["cpu_paged"], outs["torch_native"], atol=tol, rtol=tol)


@pytest.mark.parametrize("num_rows", [1, 5, 33])
def test_int8_linear_matches_reference(num_rows: int, isa_level: str) -> None:
    torch.manual_seed(0)
    weight = torch.randn(48, 64)
    weight[3] *= 20  # channels with very different ranges get their own scales
    bias = torch.randn(48)
    x = torch.randn(num_rows, 64)
    x[0] *= 100  # a loud row must not change the others' quantization
    iw = Int8Weight.quantize(weight)
    out = int8_linear(x, iw, bias)
    x_scales = x.abs().amax(1, keepdim=True) / 127
    xq = torch.round(x / x_scales).clamp(-127, 127)
    ref = (xq @ iw.qweight.float().t()) * x_scales * iw.scales + bias
    torch.testing.assert_close(out, ref, atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(out, x @ weight.t() + bias, atol=0.05 * x.abs().max().item(),
                               rtol=0.05)
    # Per-token: a row's result does not depend on the other rows of its batch.
    torch.testing.assert_close(int8_linear(x[-1:], iw, bias), out[-1:])
    bf16 = int8_linear(x.bfloat16(), iw, bias)
    assert bf16.dtype == torch.bfloat16


def test_a_stale_build_lock_is_removed_not_waited_on(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A builder killed mid-build leaves torch's `lock` file; the next one must not hang."""
    from radixlm.layers import cpu_kernels

    (tmp_path / "lock").write_text("")
    with cpu_kernels._build_lock(str(tmp_path)):
        assert not (tmp_path / "lock").exists()
    with cpu_kernels._build_lock(str(tmp_path)):  # released on exit: taken again at once
        pass


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("num_rows", [1, 32, 300])  # 300 x 3072: past the serial threshold
def test_silu_and_mul_matches_torch(dtype: torch.dtype, num_rows: int, isa_level: str) -> None:
    torch.manual_seed(0)
    x = (torch.randn(num_rows, 2 * 1536) * 6).to(dtype)  # ±6 sigma: both tails of silu
    x[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -88.5])  # the exp clamp and silu(0)
    reference = F.silu(x[:, :1536].double()) * x[:, 1536:].double()
    out = torch.ops.radixlm.silu_and_mul(x)
    assert out.shape == (num_rows, 1536) and out.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(out.double(), reference, rtol=2e-6, atol=1e-6)
    else:  # one bfloat16 rounding of the product (torch rounds silu's output too)
        torch.testing.assert_close(out.double(), reference, rtol=8e-3, atol=1e-2)
    strided = torch.randn(4, 2 * 1536 + 64)[:, : 2 * 1536].to(dtype)  # rows of a wider tensor
    torch.testing.assert_close(torch.ops.radixlm.silu_and_mul(strided).double(),
                               F.silu(strided[:, :1536].double()) * strided[:, 1536:].double(),
                               rtol=8e-3, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("num_rows", [1, 32, 600])
def test_add_rms_norm_matches_torch(dtype: torch.dtype, num_rows: int, isa_level: str) -> None:
    torch.manual_seed(0)
    x, residual = (torch.randn(num_rows, 576).to(dtype) for _ in range(2))
    weight = torch.randn(576).to(dtype)
    before = residual.clone()
    normed, summed = torch.ops.radixlm.add_rms_norm(x, residual, weight, 1e-5)
    assert torch.equal(residual, before)  # not written in place
    assert torch.equal(summed, x + residual)  # the same rounding as torch's add
    reference = F.rms_norm(summed.float(), (576,), weight.float(), 1e-5)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(normed.float(), reference, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize(("dtype", "fuse_float32"),
                         [(torch.float32, False), (torch.float32, True), (torch.bfloat16, False)],
                         ids=["fp32-exact", "fp32-fused", "bf16"])
def test_layers_take_the_fused_kernels_in_bfloat16_or_where_marked(
        dtype: torch.dtype, fuse_float32: bool) -> None:
    """bfloat16 modules take the fused kernels (same results as torch's ops up to one
    rounding), and so do float32 ones marked fuse_float32 (the bf16_weights mode); plain
    float32 modules keep torch's ops, so the exact mode stays exact."""
    from radixlm.layers.activation import SiluAndMul
    from radixlm.layers.layernorm import RMSNorm

    torch.manual_seed(0)
    exact = dtype == torch.float32 and not fuse_float32
    norm = RMSNorm(64, 1e-6, dtype)
    norm.fuse_float32 = fuse_float32
    norm.weight.data.normal_()
    x, residual = torch.randn(8, 64).to(dtype), torch.randn(8, 64).to(dtype)
    normed, summed = norm.add_and_norm(x, residual)
    expected = F.rms_norm(x + residual, (64,), norm.weight, 1e-6)
    fused_normed, fused_summed = torch.ops.radixlm.add_rms_norm(x, residual, norm.weight, 1e-6)
    if exact:
        assert torch.equal(normed, expected) and torch.equal(summed, x + residual)
    else:
        assert torch.equal(normed, fused_normed) and torch.equal(summed, fused_summed)
        tolerance = 1e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(normed, expected, rtol=tolerance, atol=tolerance)
    gate_up = torch.randn(8, 128).to(dtype)
    act = SiluAndMul()
    act.fuse_float32 = fuse_float32
    out, reference = act(gate_up), F.silu(gate_up[:, :64]) * gate_up[:, 64:]
    if exact:
        assert torch.equal(out, reference)
    else:
        assert torch.equal(out, torch.ops.radixlm.silu_and_mul(gate_up))
        tolerance = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(out, reference, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32],
                         ids=["bf16", "fp16", "fp32-fused"])
@pytest.mark.parametrize("num_tokens", [1, 7, 300])
def test_rotary_embedding_matches_torch(dtype: torch.dtype, num_tokens: int,
                                        isa_level: str) -> None:
    from radixlm.layers.rotary import apply_rotary

    torch.manual_seed(0)
    heads, head_dim = 5, 64
    positions = torch.randint(0, 2000, (num_tokens,))
    qkv = torch.randn(num_tokens, (heads + 2) * head_dim).to(dtype)
    x = qkv[:, : heads * head_dim].view(num_tokens, heads, head_dim)  # strided rows
    angles = positions[:, None].float() * torch.rand(head_dim // 2)  # [T, D / 2]
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1).to(dtype)
    cos, sin = cos_sin.unsqueeze(1).chunk(2, dim=-1)  # [T, 1, D / 2] each
    out = apply_rotary(x, cos, sin, fuse_float32=True)  # (float32: the bf16_weights mode)
    assert torch.equal(out, torch.ops.radixlm.rotary_embedding(x, cos, sin))  # the fused pass
    assert out.is_contiguous() and out.shape == x.shape and out.dtype == dtype
    x1, x2 = x.double().chunk(2, dim=-1)
    c, s = cos.double(), sin.double()
    reference = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
    tolerance = (1e-5, 1e-5) if dtype == torch.float32 else (8e-3, 2e-2)
    torch.testing.assert_close(out.double(), reference, rtol=tolerance[0], atol=tolerance[1])
    if dtype == torch.float32:  # unmarked, the exact mode: torch's operators
        x1, x2 = x.chunk(2, dim=-1)
        assert torch.equal(apply_rotary(x, cos, sin),
                           torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("num_rows", [1, 2])
def test_small_batch_linear_matches_torch(dtype: torch.dtype, num_rows: int,
                                          isa_level: str) -> None:
    from radixlm.layers.cpu_gemm import small_batch_linear

    torch.manual_seed(0)
    weight = (torch.randn(200, 96) * 0.1).to(dtype)
    bias = torch.randn(200).to(dtype)
    x = torch.randn(num_rows, 160).to(dtype)[:, 32:128]  # strided rows
    for b in (None, bias):
        out = small_batch_linear(x, weight, b)
        assert out is not None and out.shape == (num_rows, 200) and out.dtype == dtype
        reference = x.double() @ weight.double().t() + (0 if b is None else b.double())
        torch.testing.assert_close(out.double(), reference, rtol=1e-2, atol=1e-2)
    assert small_batch_linear(torch.randn(3, 96).to(dtype), weight, None) is None  # 3 rows


def test_linear_takes_the_pairs_or_the_small_batch_kernel() -> None:
    """bfloat16 layers: the pairs kernel for every batch where the CPU has bf16 dot
    products; else the plain copy for 1-2 rows and oneDNN's packed weight beyond."""
    from radixlm.layers.cpu_gemm import can_pack, pairs_capable
    from radixlm.layers.linear import ColumnParallelLinear
    from radixlm.layers.prepared_weight import OneDnnWeight, PairsWeight

    layer = ColumnParallelLinear(64, 96, bias=True, params_dtype=torch.bfloat16)
    if not can_pack(layer.weight):
        pytest.skip("no native bfloat16 on this CPU: bfloat16 weights are not packed")
    with torch.no_grad():
        layer.weight.normal_(0, 0.1)
        assert layer.bias is not None
        layer.bias.normal_()
    dense = layer.weight.detach().clone()
    pairs = pairs_capable(layer.weight)
    assert layer.prepare_weights("none", keep_plain=True) == "packed"
    if pairs:
        assert isinstance(layer.prepared, PairsWeight)
    else:
        assert isinstance(layer.prepared, OneDnnWeight) and layer.prepared.plain is not None
        assert torch.equal(layer.prepared.plain, dense)
    for rows in (1, 2, 3, 33):  # without the pairs kernel, 3 and 33: oneDNN's packed path
        x = torch.randn(rows, 64).to(torch.bfloat16)
        reference = x.float() @ dense.float().t() + layer.bias.float()
        torch.testing.assert_close(layer(x).float(), reference, rtol=2e-2, atol=2e-2)


def test_isa_levels_switch_and_name_what_the_cpu_has() -> None:
    """The kernels run at one ISA level at a time (csrc/isa.h): the highest the CPU has by
    default, any lower one the CPU has on request, never one it lacks."""
    if load_cpu_kernels() is None:
        pytest.skip(KERNELS_MISSING)
    ops = torch.ops.radixlm
    supported = list(ops.supported_isas())
    assert supported and ops.isa() in supported
    original = ops.isa()
    try:
        for level in supported:
            ops.set_isa(level)
            assert ops.isa() == level
            # the bf16 pairs kernel exists at avx512bf16 only, and says so below it
            assert bool(ops.bf16_pairs_supported()) == (level == "avx512bf16")
            if level in ("avx2", "avx512"):
                packed = ops.pack_bf16_pairs(torch.zeros(16, 8, dtype=torch.bfloat16))
                with pytest.raises(RuntimeError, match="needs AVX512_BF16"):
                    ops.bf16_pairs_linear(torch.zeros(1, 8, dtype=torch.bfloat16), packed, None)
        with pytest.raises(RuntimeError, match="unknown ISA level"):
            ops.set_isa("sse9")
    finally:
        ops.set_isa(original)


def test_radixlm_isa_caps_the_level_and_the_log_names_it() -> None:
    """RADIXLM_ISA=avx2 runs an AVX-512 machine's kernels as an AVX2-only CPU would, and
    the line that loads them names the level (a server's start-up log shows it)."""
    if "avx2" not in torch.ops.radixlm.supported_isas():
        pytest.skip("a native build (this CPU is not covered by the portable one)")
    env = {**os.environ, "RADIXLM_ISA": "avx2"}
    out = subprocess.run([sys.executable, "-m", "radixlm.layers.cpu_kernels"], env=env,
                         capture_output=True, text=True, timeout=600, check=True)
    assert "CPU kernels: ISA level avx2 of " in out.stderr + out.stdout
    assert "(ISA level avx2)" in out.stdout
