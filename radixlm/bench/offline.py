"""Offline decode throughput: radixlm's Engine vs transformers' generate, side by side.

    python -m radixlm.bench.offline [--batch-sizes 1 8 32 64] [--output-len 64]

Both run the same model (the default SmolLM2 unless --model-path is given), the
same prompts, greedy, float32 on the CPU, one after the other in this run, so
the ratio is meaningful even on a noisy machine. Throughput counts output
tokens over wall time, prefill included, for both.
"""

from __future__ import annotations

import argparse
import time

import torch

PROMPT_TEMPLATE = "Question {i}: write a few sentences about the number {i} and its uses."


def prompts(n: int) -> list[str]:
    return [PROMPT_TEMPLATE.format(i=i) for i in range(n)]


def bench_engine(model_path: str | None, batch_sizes: list[int], output_len: int) -> dict:
    from radixlm import Engine

    results = {}
    params = {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True}
    with Engine(model_path=model_path, max_total_tokens=max(batch_sizes) * (output_len + 64),
                max_running_requests=max(batch_sizes), disable_radix_cache=True) as engine:
        engine.generate("warm up", {"max_new_tokens": 4})
        for bs in batch_sizes:
            start = time.perf_counter()
            outs = engine.generate(prompts(bs), params)
            elapsed = time.perf_counter() - start
            num_tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
            results[bs] = num_tokens / elapsed
    return results


def bench_transformers(model_dir: str, batch_sizes: list[int], output_len: int) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    results = {}
    with torch.inference_mode():
        for bs in batch_sizes:
            enc = tokenizer(prompts(bs), return_tensors="pt", padding=True)
            start = time.perf_counter()
            out = model.generate(**enc, max_new_tokens=output_len, min_new_tokens=output_len,
                                 do_sample=False, pad_token_id=tokenizer.pad_token_id)
            elapsed = time.perf_counter() - start
            num_tokens = (out.shape[1] - enc["input_ids"].shape[1]) * bs
            results[bs] = num_tokens / elapsed
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--skip-transformers", action="store_true")
    args = parser.parse_args()

    from radixlm.entrypoints.launch import prepare_environment
    from radixlm.model_loader.model_path import resolve_model_dir

    prepare_environment()
    model_dir = resolve_model_dir(args.model_path)
    ours = bench_engine(args.model_path, args.batch_sizes, args.output_len)
    theirs = {} if args.skip_transformers else bench_transformers(
        model_dir, args.batch_sizes, args.output_len)
    print(f"decode throughput, output tokens/s (output_len={args.output_len}, greedy, float32)")
    print(f"{'batch':>6} {'radixlm':>10} {'transformers':>13} {'ratio':>7}")
    for bs in args.batch_sizes:
        t = theirs.get(bs)
        ratio = f"{ours[bs] / t:6.2f}x" if t else "   -"
        print(f"{bs:>6} {ours[bs]:>10.1f} {t if t else float('nan'):>13.1f} {ratio:>7}")


if __name__ == "__main__":
    main()
