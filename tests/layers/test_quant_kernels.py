"""The quantized kernels (csrc/quant) per GGUF format and per ISA level the CPU has,
against gguf-py: repacking then dequantizing gives gguf-py's values bit for bit, and
q_linear equals a float64 matmul of gguf-py's dequantized weight with the input
quantized as llama.cpp quantizes it (Q8_0 blocks of 32 for the legacy formats, Q8_K
blocks of 256 for the K-quants), up to float32 summation: ragged output counts, 0 to
9 rows, bf16 inputs, biases, several formats in one weight."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from radixlm.layers.cpu_kernels import load_cpu_kernels

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize  # noqa: E402

pytestmark = pytest.mark.skipif(load_cpu_kernels() is None, reason="CPU kernels are not built")

# GGML type → byte offsets of its fp16 scales in a block (the rest may be any bytes)
FP16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
               "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}
FORMATS = list(FP16_FIELDS)


def _isas() -> list[str]:
    """Every ISA level the CPU has; where it has AMX (which runs 16 rows and more at
    avx512bf16), avx512bf16 once more without it, so the VNNI tiles run those too."""
    if load_cpu_kernels() is None:
        return []
    levels = list(torch.ops.radixlm.supported_isas())
    return levels + (["avx512bf16-noamx"] if torch.ops.radixlm.amx_supported() else [])


@pytest.fixture(params=_isas())
def isa(request: pytest.FixtureRequest) -> Iterator[str]:
    ops = torch.ops.radixlm
    before, amx_before = ops.isa(), ops.amx_supported() and ops.amx()
    level, _, mode = str(request.param).partition("-")
    ops.set_isa(level)
    if ops.amx_supported():
        ops.set_amx(mode != "noamx")
    try:
        yield request.param
    finally:
        ops.set_isa(before)
        if ops.amx_supported():
            ops.set_amx(amx_before)


def random_rows(name: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """n GGUF rows of k inputs of type `name`: random bytes, sane fp16 scales (and Q4_1's
    and Q5_1's offsets)."""
    qtype = gguf.GGMLQuantizationType[name]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n, k // block, size), dtype=np.uint8)
    for off in FP16_FIELDS[name]:
        scale = (rng.random((n, k // block)) * 0.01 + 0.001) * rng.choice([-1, 1], (n, k // block))
        raw[:, :, off:off + 2] = scale.astype(np.float16).view(np.uint8).reshape(n, k // block, 2)
    return raw.reshape(n, -1)


def pack(rows: list[np.ndarray], names: list[str], k: int) -> torch.Tensor:
    types = [int(gguf.GGMLQuantizationType[n]) for n in names]
    return torch.ops.radixlm.q_pack([torch.from_numpy(r) for r in rows], types, k)


def llama_cpp_activations(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """x [M, K] float32 as llama.cpp's matmul sees it: quantized to Q8_0 (block 32: d =
    amax / 127 in fp16) or Q8_K (block 256: iscale = -128 / x_max) and dequantized; and
    for blocks of 32, Q8_1's s = d * sum(q) per block in fp16 [M, K / 32]."""
    out = np.zeros(x.shape, dtype=np.float64)
    sums = np.zeros((x.shape[0], x.shape[1] // 32), dtype=np.float64)
    blocks = x.reshape(x.shape[0], -1, block)
    for r in range(x.shape[0]):
        for b, v in enumerate(blocks[r]):
            amax = np.abs(v).max()
            if amax == 0:
                continue
            if block == 32:
                d = amax / np.float32(127)
                q = np.rint(v * (np.float32(127) / amax))
                out[r, b * 32:(b + 1) * 32] = q * np.float64(np.float32(np.float16(d)))
                sums[r, b] = np.float16(d * np.float32(q.sum()))
            else:
                iscale = np.float32(-128) / v[np.argmax(np.abs(v))]
                q = np.minimum(np.rint(v * iscale), 127)
                out[r, b * 256:(b + 1) * 256] = q * np.float64(np.float32(1) / iscale)
    return out, sums


def block_offsets(rows: np.ndarray, name: str) -> np.ndarray | None:
    """Q4_1 / Q5_1: each block's offset m (w = d * q + m) [N, K / 32]; None otherwise."""
    if name not in ("Q4_1", "Q5_1"):
        return None
    size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]][1]
    blocks = rows.reshape(rows.shape[0], -1, size)
    return blocks[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)


def reference(x: torch.Tensor, weights: list[np.ndarray], names: list[str],
              rows: list[np.ndarray]) -> np.ndarray:
    """llama.cpp's arithmetic in float64: Q4_1 / Q5_1 take their offsets' share through
    Q8_1's fp16 sums, the rest through the dequantized activations."""
    xf = x.float().numpy()
    parts = []
    for w, name, raw in zip(weights, names, rows):
        xq, sums = llama_cpp_activations(xf, 256 if name.endswith("_K") else 32)
        m = block_offsets(raw, name)
        if m is None:
            parts.append(xq @ w.astype(np.float64).T)
        else:  # w - m is d * q (to float32 rounding)
            scaled = w.astype(np.float64) - np.repeat(m, 32, axis=1)
            parts.append(xq @ scaled.T + sums @ m.T)
    return np.concatenate(parts, axis=1)


@pytest.mark.parametrize("name", FORMATS)
def test_repacking_keeps_gguf_values_exactly(name: str) -> None:
    k = 512 if name.endswith("_K") else 96  # 96: three legacy blocks, an odd chunk count
    rows = random_rows(name, 37, k)  # 37: a partial last group of 16 columns
    blob = pack([rows], [name], k)
    ours = torch.ops.radixlm.q_dequantize(blob).numpy()
    assert np.array_equal(ours, dequantize(rows, gguf.GGMLQuantizationType[name]))
    ids = torch.tensor([36, 0, 17, 17])
    looked_up = torch.ops.radixlm.q_embedding(blob, ids, False)
    assert torch.equal(looked_up, torch.from_numpy(ours[ids.numpy()]))
    as_bf16 = torch.ops.radixlm.q_embedding(blob, ids, True)
    assert torch.equal(as_bf16, looked_up.to(torch.bfloat16))


@pytest.mark.parametrize("name", FORMATS)
def test_q_linear_matches_llama_cpp_arithmetic(name: str, isa: str) -> None:
    k = 512 if name.endswith("_K") else 160
    n = 40  # two and a half groups: tiles of 32 columns and a ragged one
    rows = random_rows(name, n, k, seed=1)
    weight = dequantize(rows, gguf.GGMLQuantizationType[name])
    blob = pack([rows], [name], k)
    bias = torch.randn(n)
    gen = torch.Generator().manual_seed(2)
    # 37 rows: past the row count from which a column tile's scales and levels are
    # worked out once for all its row tiles (quant_gemm_body.h), with a ragged last tile;
    # with AMX two tiles of 16 rows and a ragged one (quant_gemm_amx.cpp), 16 exactly one
    for m in (0, 1, 4, 9, 16, 37):
        x = torch.randn(m, k, generator=gen)
        out = torch.ops.radixlm.q_linear(x, blob, bias)
        assert out.shape == (m, n) and out.dtype == torch.float32
        if m:
            ref = reference(x, [weight], [name], [rows]) + bias.double().numpy()
            np.testing.assert_allclose(out.double().numpy(), ref, rtol=0, atol=2e-6 * np.abs(ref).max())


def test_segments_bf16_inputs_and_strided_rows(isa: str) -> None:
    """One weight of three segments (a fused q/k/v in Q4_K, Q6_K and Q8_0), bf16 input
    rows with a stride, bf16 and float32 outputs."""
    k = 256
    names = ["Q4_K", "Q6_K", "Q8_0"]
    rows = [random_rows(nm, n, k, seed=i) for i, (nm, n) in enumerate(zip(names, [48, 16, 24]))]
    weights = [dequantize(r, gguf.GGMLQuantizationType[nm]) for r, nm in zip(rows, names)]
    blob = pack(rows, names, k)
    info = torch.ops.radixlm.q_blob_info(blob)
    assert info[:3] == [88, 256, 3]
    wide = torch.randn(6, 2 * k).to(torch.bfloat16)
    x = wide[:, :k]  # rows with a stride of 2k
    ref = reference(x, weights, names, rows)
    out16 = torch.ops.radixlm.q_linear(x, blob, None)
    assert out16.dtype == torch.bfloat16
    np.testing.assert_allclose(out16.double().numpy(), ref, rtol=1e-2, atol=1e-2 * np.abs(ref).max())
    out32 = torch.ops.radixlm.q_linear(x, blob, None, True)
    assert out32.dtype == torch.float32
    np.testing.assert_allclose(out32.double().numpy(), ref, rtol=0, atol=2e-6 * np.abs(ref).max())


def test_amx_switch() -> None:
    """AMX runs only where the CPU has it and at the avx512bf16 level; turning it on
    where it is missing is refused."""
    ops = torch.ops.radixlm
    before, amx_before = ops.isa(), ops.amx()
    try:
        if not ops.amx_supported():
            assert not ops.amx()
            with pytest.raises(RuntimeError, match="no AMX"):
                ops.set_amx(True)
            ops.set_amx(False)  # turning it off is always allowed
            return
        ops.set_amx(True)
        ops.set_isa("avx512bf16")
        assert ops.amx()
        ops.set_isa("avx512")
        assert not ops.amx()
        ops.set_isa("avx512bf16")
        ops.set_amx(False)
        assert not ops.amx()
    finally:
        ops.set_isa(before)
        if ops.amx_supported():
            ops.set_amx(amx_before)


def test_bad_inputs_are_refused() -> None:
    rows = random_rows("Q4_0", 16, 64)
    blob = pack([rows], ["Q4_0"], 64)
    with pytest.raises(RuntimeError, match="features"):
        torch.ops.radixlm.q_linear(torch.randn(2, 32), blob, None)
    with pytest.raises(RuntimeError, match="not a multiple"):
        torch.ops.radixlm.q_pack([torch.from_numpy(rows)], [2], 48)
    with pytest.raises(RuntimeError, match="not supported"):
        torch.ops.radixlm.q_pack([torch.from_numpy(rows)], [20], 64)  # IQ4_NL
    with pytest.raises(RuntimeError, match="outside"):
        torch.ops.radixlm.q_embedding(blob, torch.tensor([16]), False)


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_K"])
def test_quantizing_float_weights(name: str) -> None:
    """q_quantize writes GGUF rows: Q8_0 and Q4_0 as gguf-py's reference quantizers do,
    Q4_K within its usual error of the float weight."""
    qtype = gguf.GGMLQuantizationType[name]
    w = torch.randn(32, 512, generator=torch.Generator().manual_seed(3)) * 0.05
    raw = torch.ops.radixlm.q_quantize(w, int(qtype)).numpy()
    values = dequantize(raw, qtype)
    if name != "Q4_K":
        expected = gguf.quants.quantize(w.numpy(), qtype)
        assert np.abs(values - dequantize(expected, qtype)).max() <= 1e-6
    rel = np.sqrt(((values - w.numpy()) ** 2).mean()) / w.std().item()
    assert rel < {"Q8_0": 0.01, "Q4_0": 0.12, "Q4_K": 0.1}[name], rel
