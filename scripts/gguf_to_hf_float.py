"""Write a GGUF file as a float Hugging Face folder (safetensors shards), for peers that
cannot read GGUF block formats (vLLM-CPU) to serve a model of the same shape.

    python scripts/gguf_to_hf_float.py FILE.gguf OUT_DIR [--dtype float32|bfloat16]

config.json, generation_config.json and the tokenizer files come from radixlm's own GGUF
folder (model_loader/gguf_convert.py); the weights are dequantized tensor by tensor with
llama.cpp's fix-ups undone (`iterate_gguf_weights`) and written in shards of about
--shard-mb each, so memory holds one shard at a time. For benchmarks only: the values are
the file's, dequantized, so a random-weight file gives a folder of the same random model.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile

import torch
from safetensors.torch import save_file

from radixlm.model_loader.gguf_convert import GGUF_LINK, convert_gguf, iterate_gguf_weights


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("out_dir")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--shard-mb", type=int, default=1024)
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    if os.path.isfile(os.path.join(args.out_dir, "model.safetensors.index.json")):
        print(f"{args.out_dir} exists; nothing to do")
        return
    with tempfile.TemporaryDirectory() as cache:
        folder = convert_gguf(args.gguf, cache_root=cache)
        tmp_out = args.out_dir.rstrip("/") + ".tmp"
        shutil.rmtree(tmp_out, ignore_errors=True)
        os.makedirs(tmp_out)
        for name in os.listdir(folder):
            if name != GGUF_LINK:
                shutil.copy(os.path.join(folder, name), tmp_out)
    config_path = os.path.join(tmp_out, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["torch_dtype"] = args.dtype
    config.pop("dtype", None)
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2)

    weight_map: dict[str, str] = {}
    shard: dict[str, torch.Tensor] = {}
    shard_bytes, shards, total = 0, 0, 0

    def flush() -> None:
        nonlocal shard, shard_bytes, shards
        if shard:
            shards += 1
            fname = f"model-{shards:05d}.safetensors"
            save_file(shard, os.path.join(tmp_out, fname), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, fname))
            shard, shard_bytes = {}, 0

    for name, tensor in iterate_gguf_weights(args.gguf):
        assert isinstance(tensor, torch.Tensor)
        t = tensor.to(dtype).contiguous()
        shard[name] = t
        shard_bytes += t.numel() * t.element_size()
        total += t.numel() * t.element_size()
        if shard_bytes >= args.shard_mb * 2**20:
            flush()
    flush()
    with open(os.path.join(tmp_out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    os.rename(tmp_out, args.out_dir)
    print(f"{args.out_dir}: {len(weight_map)} tensors, {total / 2**30:.2f} GiB of {args.dtype} "
          f"in {shards} shards")


if __name__ == "__main__":
    main()
