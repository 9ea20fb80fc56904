"""radixlm against llama.cpp on the same GGUF files: teacher-forced next-token agreement.

    LLAMA_PY=~/peer-llama/bin/python .venv/bin/python scripts/gguf_accuracy.py \
        [--types q4_1 q8_0 q6_k q4_k_m] [--tokens N] [--llama-kv f16|f32]

For each type: the default model's own file (q4_1), or that file requantized by
llama.cpp's own quantizer (llama_model_quantize with allow_requantize: no float
checkpoint of the default model is on the machine). Over a fixed text
(tests/models/data/gate_text.txt then accuracy_text.txt: 1,308 tokens with SmolLM2's
tokenizer; `--tokens` keeps the first N), one prompt, teacher-forced:

- llama.cpp's logits, the prompt in batches of 512 (the reference), and one token at
  a time (llama.cpp against itself: how many top-1 choices are near-ties that rounding
  decides);
- radixlm's logits, the file's blocks through the quantized kernels (chunks of 96,
  the C++ layer stack) with a float32 and a bfloat16 KV cache (`--kv-cache-dtype
  bfloat16`) and, for comparison, its float32 path over the same weights dequantized
  (`--quantization none`);

printing top-1 agreement, the mean KL(llama.cpp || radixlm) over the whole vocabulary
(nats per position), and the agreement on positions where llama.cpp's top two logits
are at least 0.1 apart. Each file's tensor formats are printed first (a row of
SmolLM2-135M is 576 wide, not a multiple of 256: llama.cpp's K-quant file types put
their fallback formats on those tensors).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "models"))
sys.path.insert(0, HERE)

from _forward_harness import PoolRunner  # noqa: E402
from make_gguf_fixtures import run_llama_py  # noqa: E402

from radixlm.default_model import default_model_path  # noqa: E402
from radixlm.layers.prepared_weight import prepare_model  # noqa: E402
from radixlm.model_loader.gguf_file import describe_types, read_gguf  # noqa: E402
from radixlm.model_loader.loader import load_model  # noqa: E402
from radixlm.model_loader.model_path import resolve_model_dir  # noqa: E402

# llama.cpp's LLAMA_FTYPE_MOSTLY_* of each type
FTYPES = {"q4_1": 3, "q8_0": 7, "q4_k_m": 15, "q5_k_m": 17, "q6_k": 18, "q4_0": 2}
MARGIN = 0.1
GGML_KV_TYPES = {"f32": 0, "f16": 1}
TEXTS = ("gate_text.txt", "accuracy_text.txt")


def text_tokens() -> list[int]:
    from transformers import AutoTokenizer

    data = os.path.join(HERE, "..", "tests", "models", "data")
    text = "".join(open(os.path.join(data, name)).read() for name in TEXTS)
    return list(AutoTokenizer.from_pretrained(resolve_model_dir(None))(text).input_ids)

# llama.cpp on one thread: its threads spin at every barrier, and on a shared 2-core
# machine two of them ran the 1,308 one-token steps many times slower (logits do not
# depend on the thread count).
_LLAMA_CODE = r"""
import json, sys, numpy as np, llama_cpp
if sys.argv[1] == "quantize":
    p = llama_cpp.llama_model_quantize_default_params(); p.ftype = int(sys.argv[4])
    p.nthread = 1; p.allow_requantize = True
    sys.exit(llama_cpp.llama_model_quantize(sys.argv[2].encode(), sys.argv[3].encode(), p))
ids = json.loads(sys.argv[3]); batch = int(sys.argv[5]); kv = int(sys.argv[6])
llm = llama_cpp.Llama(sys.argv[2], n_ctx=max(512, len(ids) + 8), n_batch=batch, n_ubatch=batch,
                      logits_all=True, n_threads=1, verbose=False, type_k=kv, type_v=kv,
                      flash_attn=False)
llm.eval(ids)
np.save(sys.argv[4], np.asarray(llm.scores[:len(ids)], dtype=np.float32))
"""


def llama(*args: str) -> None:
    run_llama_py(_LLAMA_CODE, *args)


def llama_logits(model: str, ids: list[int], batch: int, kv: str = "f16") -> torch.Tensor:
    """llama.cpp's logits [T, vocab]; kv: its KV cache's type (f16, its default, or f32)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.npy")
        llama("logits", model, json.dumps(ids), out, str(batch), str(GGML_KV_TYPES[kv]))
        return torch.from_numpy(np.load(out))


def radixlm_logits(path: str, ids: list[int], quantization: str,
                   kv_cache_dtype: str = "auto") -> torch.Tensor:
    model, config = load_model(resolve_model_dir(path), torch.float32, "cpu",
                               keep_quantized=quantization == "gguf")
    prepare_model(model, quantization)
    runner = PoolRunner(model, config, num_slots=len(ids) + 8, max_requests=1,
                        max_context=len(ids) + 8, backend="cpu_paged",
                        kv_cache_dtype=kv_cache_dtype)
    row = runner.new_request()
    parts = [runner.step([(row, ids[i : i + 96])])[0] for i in range(0, len(ids), 96)]
    return torch.cat(parts).float()


def compare(ref: torch.Tensor, ours: torch.Tensor) -> str:
    top1 = (ref.argmax(-1) == ours.argmax(-1)).double()
    kls = []
    for i in range(0, len(ref), 128):  # [T, vocab] in float64: a few rows at a time
        log_p = torch.log_softmax(ref[i : i + 128].double(), -1)
        log_q = torch.log_softmax(ours[i : i + 128].double(), -1)
        kls.append((log_p.exp() * (log_p - log_q)).sum(-1))
    kl = torch.cat(kls).mean().item()
    top2 = ref.topk(2, -1).values
    clear = (top2[:, 0] - top2[:, 1]) >= MARGIN
    return (f"top-1 {top1.mean().item():.4f}, KL {kl:.5f}, top-1 where llama.cpp's margin >= "
            f"{MARGIN}: {top1[clear].mean().item():.4f} ({int(clear.sum())} of {len(ref)})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--types", nargs="+", default=["q4_1", "q8_0", "q6_k", "q4_k_m"])
    p.add_argument("--tokens", type=int, default=None, help="the first N tokens (all: 1,308)")
    p.add_argument("--llama-kv", choices=["f16", "f32"], default="f16",
                   help="llama.cpp's KV cache type (f16: its default; f32: radixlm's here)")
    args = p.parse_args()
    torch.set_grad_enabled(False)
    ids = text_tokens()[: args.tokens]
    source = default_model_path()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.types:
            path = source
            if name != "q4_1":
                path = os.path.join(tmp, f"smollm2-{name}.gguf")
                llama("quantize", source, path, str(FTYPES[name]))
            ref = llama_logits(path, ids, 512, args.llama_kv)
            print(f"{name} ({os.path.getsize(path) / 2**20:.0f} MiB), {len(ids)} tokens; "
                  f"tensors: {describe_types(read_gguf(path))}")
            print(f"  llama.cpp one token at a time: {compare(ref, llama_logits(path, ids, 1, args.llama_kv))}")
            print(f"  radixlm quantized kernels:     "
                  f"{compare(ref, radixlm_logits(path, ids, 'gguf'))}")
            print(f"  radixlm quantized, bf16 KV:    "
                  f"{compare(ref, radixlm_logits(path, ids, 'gguf', 'bfloat16'))}")
            print(f"  radixlm float32 (dequantized): "
                  f"{compare(ref, radixlm_logits(path, ids, 'none'))}", flush=True)


if __name__ == "__main__":
    main()
