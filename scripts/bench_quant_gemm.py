"""Speed of the quantized matmul (csrc/quant) per GGUF format and row count.

    .venv/bin/python scripts/bench_quant_gemm.py [--types q4_k q6_k ...] [--rows 1 16 256]

One `q_linear` over each of a 1B Llama layer's shapes (fused q/k/v 3072 x 2048,
o 2048 x 2048, fused gate/up 16384 x 2048, down 2048 x 8192) on random blocks
(sane fp16 scales), at each row count; prints the best of 5 repeats as ms and
G multiply-adds a second over all threads. Compare two builds side by side in
one run (PYTHONPATH=OTHER_TREE for the other), with nothing else running.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from radixlm.layers.cpu_kernels import load_cpu_kernels

TYPES = {"q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q2_k": 10, "q3_k": 11,
         "q4_k": 12, "q5_k": 13, "q6_k": 14}
# GGML type -> (inputs per block, bytes per block, byte offsets of its fp16 scales)
BLOCKS = {"q4_0": (32, 18, [0]), "q4_1": (32, 20, [0, 2]), "q5_0": (32, 22, [0]),
          "q5_1": (32, 24, [0, 2]), "q8_0": (32, 34, [0]), "q2_k": (256, 84, [80, 82]),
          "q3_k": (256, 110, [108]), "q4_k": (256, 144, [0, 2]), "q5_k": (256, 176, [0, 2]),
          "q6_k": (256, 210, [208])}
SHAPES = [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192)]  # (N, K)


def random_blocks(name: str, n: int, k: int, rng: np.random.Generator) -> torch.Tensor:
    block, size, fp16 = BLOCKS[name]
    raw = rng.integers(0, 256, size=(n, k // block, size), dtype=np.uint8)
    for off in fp16:
        scale = (rng.random((n, k // block)) * 0.01 + 0.001) * rng.choice([-1, 1], (n, k // block))
        raw[:, :, off:off + 2] = scale.astype(np.float16).view(np.uint8).reshape(n, k // block, 2)
    return torch.from_numpy(raw.reshape(n, -1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--types", nargs="+", default=["q4_k", "q6_k"], choices=sorted(TYPES))
    p.add_argument("--rows", nargs="+", type=int, default=[1, 16, 64, 256])
    args = p.parse_args()
    if load_cpu_kernels() is None:
        raise SystemExit("the CPU kernels are not built (scripts/setup.sh)")
    print(f"isa {torch.ops.radixlm.isa()}, threads {torch.get_num_threads()}")
    rng = np.random.default_rng(0)
    for name in args.types:
        blobs = [(torch.ops.radixlm.q_pack([random_blocks(name, n, k, rng)], [TYPES[name]], k), n, k)
                 for n, k in SHAPES]
        for m in args.rows:
            xs = [torch.randn(m, k) for _, _, k in blobs]

            def run(blobs: list[tuple[torch.Tensor, int, int]] = blobs, xs: list[torch.Tensor] = xs) -> None:
                for (blob, _, _), x in zip(blobs, xs):
                    torch.ops.radixlm.q_linear(x, blob, None, False)

            run()
            reps = max(1, 64 // m)
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(reps):
                    run()
                best = min(best, (time.perf_counter() - t0) / reps)
            macs = sum(n * k for _, n, k in blobs) * m
            print(f"{name} rows {m:4d}: {best * 1e3:8.2f} ms  {macs / best / 1e9:6.1f} GMAC/s", flush=True)


if __name__ == "__main__":
    main()
