"""The paged attention kernel over every KV storage format (--kv-cache-dtype) and under
sliding windows, against a float64 reference over the same stored rows, at every ISA
level the CPU has: decodes, 1 + K rows, short and long (blocked) extends after cached
prefixes, ragged lengths, GQA, head dims with and without the vector paths. Also: the
C++ store equals the Python quantizer bit for bit, and keys outside every window are
never read (they hold NaN here)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _kernels import requires_kernels

from radixlm.mem_cache.kv_format import dequantize_rows, kv_format, quantize_rows

pytestmark = requires_kernels()

H, HKV = 6, 2
SLOTS = 1200

# (prefix_lens, extend_lens): request b attends with extend_lens[b] new rows after a
# cached prefix of prefix_lens[b] tokens.
SCENARIOS = {
    "decode": ([7, 0, 300, 1], [1, 1, 1, 1]),
    "mixed": ([5, 40, 0, 12], [1, 4, 9, 40]),
    "long-mixed": ([130, 3, 0], [200, 1, 7]),  # the blocked path: several blocks both ways
    "long-fresh": ([0], [150]),
}


def _stored_pool(kv_dtype: str, head_dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """K and V buffers [SLOTS, HKV, row] filled with random rows stored as kv_dtype."""
    fmt = kv_format(kv_dtype, dtype, head_dim)
    k = torch.randn(SLOTS, HKV, head_dim) * 2
    v = torch.randn(SLOTS, HKV, head_dim)
    k[:, :, 3] *= 8  # an outlier channel, as real keys have
    return quantize_rows(k.to(dtype), fmt), quantize_rows(v.to(dtype), fmt)


def _layout(prefix_lens: list[int], extend_lens: list[int]) -> dict[str, torch.Tensor]:
    """Each request's slots (shuffled, as a pool hands them out) and the kernel's index
    tensors."""
    perm = torch.randperm(SLOTS - 1) + 1
    table = torch.zeros(len(prefix_lens), 512, dtype=torch.int64)
    used = 0
    for b, (p, e) in enumerate(zip(prefix_lens, extend_lens)):
        table[b, : p + e] = perm[used : used + p + e]
        used += p + e
    starts = torch.tensor([sum(extend_lens[:b]) for b in range(len(extend_lens))])
    return {"table": table, "rows": torch.arange(len(prefix_lens)),
            "seq_lens": torch.tensor([p + e for p, e in zip(prefix_lens, extend_lens)]),
            "starts": starts, "q_lens": torch.tensor(extend_lens)}


def _reference(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
               lay: dict[str, torch.Tensor], scale: float, window: int) -> torch.Tensor:
    """float64 attention over the dequantized stored rows, request by request."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b in range(lay["rows"].numel()):
        seq, n, start = (int(lay[x][b]) for x in ("seq_lens", "q_lens", "starts"))
        slots = lay["table"][b, :seq]
        keys = dequantize_rows(k_buf[slots], torch.float64, q.shape[-1]).transpose(0, 1)
        values = dequantize_rows(v_buf[slots], torch.float64, q.shape[-1]).transpose(0, 1)
        # keys, values: [Hkv, seq, D]
        pos = torch.arange(seq - n, seq)[:, None]
        key_pos = torch.arange(seq)[None, :]
        mask = key_pos <= pos
        if window:
            mask &= key_pos > pos - window
        qb = q[start : start + n].double().transpose(0, 1)  # [H, n, D]
        res = F.scaled_dot_product_attention(qb, keys, values, attn_mask=mask, scale=scale,
                                             enable_gqa=True)
        out[start : start + n] = res.transpose(0, 1)
    return out


def _run(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
         lay: dict[str, torch.Tensor], scale: float, window: int) -> torch.Tensor:
    return torch.ops.radixlm.paged_attention(q, k_buf, v_buf, lay["table"], lay["rows"],
                                             lay["seq_lens"], lay["starts"], lay["q_lens"],
                                             scale, window)


def _tolerance(dtype: torch.dtype, kv_dtype: str, isa_level: str) -> float:
    # float32 queries: summation order only, but over bf16 K/V at avx512bf16 the queries
    # and probabilities rounded to bf16 for the CPU's bf16 dot products; bf16 queries:
    # the output's rounding and, at avx512bf16, those roundings too, and quantized K/V
    # (int8: the rotated queries as well).
    if dtype == torch.float32:
        return 3e-2 if kv_dtype == "bfloat16" and isa_level == "avx512bf16" else 5e-5
    return 3e-2 if kv_dtype in ("auto", "bfloat16") else 6e-2


@pytest.mark.parametrize("kv_dtype", ["auto", "bfloat16", "int8", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("head_dim", [16, 64, 128])
def test_kernel_reads_every_format(kv_dtype: str, dtype: torch.dtype, scenario: str,
                                   head_dim: int, isa_level: str) -> None:
    torch.manual_seed(0)
    prefix_lens, extend_lens = SCENARIOS[scenario]
    if head_dim == 16 and max(extend_lens) > 16:
        pytest.skip("head dim 16 has no blocked path: its long extends run in torch")
    k_buf, v_buf = _stored_pool(kv_dtype, head_dim, dtype)
    lay = _layout(prefix_lens, extend_lens)
    q = torch.randn(sum(extend_lens), H + HKV, head_dim).to(dtype)[:, :H]  # strided, as the model's
    out = _run(q, k_buf, v_buf, lay, head_dim**-0.5, 0)
    ref = _reference(q, k_buf, v_buf, lay, head_dim**-0.5, 0)
    tol = _tolerance(dtype, kv_dtype, isa_level)
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_one_query_head_per_kv_head(dtype: torch.dtype, isa_level: str) -> None:
    """Without grouping (H = HKV, as SmolLM2-1.7B), a task takes 4x the query rows of a
    grouped one (attention_body.h: each key block serves 256 score rows): rows past a
    block of 64, ragged last tasks."""
    torch.manual_seed(3)
    k_buf, v_buf = _stored_pool("auto", 64, dtype)
    for scenario in ("long-mixed", "long-fresh"):
        prefix_lens, extend_lens = SCENARIOS[scenario]
        lay = _layout(prefix_lens, extend_lens)
        q = torch.randn(sum(extend_lens), HKV, 64).to(dtype)
        out = _run(q, k_buf, v_buf, lay, 0.125, 0)
        ref = _reference(q, k_buf, v_buf, lay, 0.125, 0)
        tol = _tolerance(dtype, "auto", isa_level)
        torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol, msg=scenario)


@pytest.mark.parametrize("kv_dtype", ["auto", "bfloat16", "int8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("window", [1, 7, 64, 100, 4096])
@pytest.mark.parametrize("head_dim", [16, 64])
def test_sliding_window(kv_dtype: str, dtype: torch.dtype, window: int, head_dim: int,
                        isa_level: str) -> None:
    """Windows shorter and longer than the prefixes, than a key block and than a task's
    query rows; keys outside every row's window hold NaN and must not be read."""
    torch.manual_seed(1)
    scenarios = ["decode", "mixed"] + (["long-mixed", "long-fresh"] if head_dim == 64 else [])
    for scenario in scenarios:
        prefix_lens, extend_lens = SCENARIOS[scenario]
        k_buf, v_buf = _stored_pool(kv_dtype, head_dim, dtype)
        lay = _layout(prefix_lens, extend_lens)
        poisoned = [k_buf.clone(), v_buf.clone()]
        for b, p in enumerate(prefix_lens):
            unseen = lay["table"][b, : max(p - window + 1, 0)]  # before the first row's window
            for buf in poisoned:
                if buf.dtype == torch.int8:  # the rows' float16 scales
                    nan = torch.tensor([float("nan")], dtype=torch.float16).view(torch.int8)
                    buf[unseen, :, head_dim:] = nan.repeat((buf.shape[-1] - head_dim) // 2)
                else:
                    buf[unseen] = float("nan")
        q = torch.randn(sum(extend_lens), H, head_dim).to(dtype)
        out = _run(q, poisoned[0], poisoned[1], lay, 0.2, window)
        assert not out.isnan().any(), f"{scenario}: a key outside the window was read"
        ref = _reference(q, k_buf, v_buf, lay, 0.2, window)
        tol = _tolerance(dtype, kv_dtype, isa_level)
        torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol, msg=scenario)


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "int8", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_store_equals_python_quantizer(kv_dtype: str, dtype: torch.dtype) -> None:
    """torch.ops.radixlm.kv_store (what the C++ layer stack and the backends call) writes
    the bytes kv_format.quantize_rows computes, from strided K/V, leaving other slots."""
    torch.manual_seed(2)
    head_dim = 64
    fmt = kv_format(kv_dtype, dtype, head_dim)
    qkv = (torch.randn(9, 3 * HKV, head_dim) * 3).to(dtype)
    qkv[0, 0] = 0.0  # an all-zero row: scale 0
    qkv[1, 1, 5] = 1e6  # beyond fp8's range: clamped
    k, v = qkv[:, :HKV], qkv[:, HKV : 2 * HKV]  # strided views
    loc = torch.tensor([3, 8, 1, 20, 5, 9, 2, 30, 11])
    k_buf = torch.zeros(40, HKV, fmt.row_width, dtype=fmt.storage)
    v_buf = torch.zeros_like(k_buf)
    torch.ops.radixlm.kv_store(k_buf, v_buf, loc, k, v)
    for buf, x in ((k_buf, k), (v_buf, v)):
        expected = torch.zeros_like(buf)
        expected[loc] = quantize_rows(x, fmt)
        assert torch.equal(buf.view(torch.uint8), expected.view(torch.uint8))
    back = dequantize_rows(k_buf[loc], torch.float32, head_dim)
    assert back.isfinite().all()
    if kv_dtype == "int8":  # every row within 1% (the loud one's block aside)
        err = (back - k.float()).norm(dim=-1) / k.float().norm(dim=-1).clamp_min(1e-9)
        err[1, 1] = 0.0
        assert err.max() < 0.01, err.max()
