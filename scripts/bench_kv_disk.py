"""TTFT of a long prefix read back from the KV disk tier, against computing it (issue 35).

Two Engines on one disk-tier folder, with a pool that holds one prompt but not two:

1. cold: PREFIX + SUFFIX tokens, nothing cached (the disk tier writing through);
   pool hit: the prefix again with another suffix;
   cold 2: another prompt of the same length, which evicts the prefix from the pool;
   evicted: the prefix again, read back from disk;
2. restart: a new Engine on the same folder, the prefix with yet another suffix, read
   from disk (the block files' pages are dropped from the OS page cache first with
   posix_fadvise, unless --warm-page-cache).

`--baseline` adds a cold run on an Engine without a disk tier (what writing costs).
Each request asks for one token, so its latency is its TTFT. Prompts are random token
ids. Run with nothing else on the machine (`cpulock exclusive`):

    cpulock exclusive .venv/bin/python scripts/bench_kv_disk.py --prefix-len 8000
    cpulock exclusive .venv/bin/python scripts/bench_kv_disk.py \\
        --model-path synthetic-1b-f16.gguf --prefix-len 8000
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import shutil
import tempfile
import time
from typing import Any

from radixlm import Engine

ONE_TOKEN = {"temperature": 0.0, "max_new_tokens": 1, "ignore_eos": True}


def ttft(eng: Engine, ids: list[int]) -> tuple[float, dict[str, Any]]:
    start = time.perf_counter()
    out = eng.generate(input_ids=ids, sampling_params=ONE_TOKEN)
    return time.perf_counter() - start, out["meta_info"]


def random_ids(seed: int, n: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, vocab - 100) for _ in range(n)]


def drop_page_cache(folder: str) -> int:
    """Ask the OS to drop the cached pages of every block file (no root needed)."""
    n = 0
    for path in glob.glob(os.path.join(folder, "**", "*.kvb"), recursive=True):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += 1
        finally:
            os.close(fd)
    return n


def wait_written(eng: Engine) -> dict[str, Any]:
    while True:
        info = eng.get_server_info()
        if not info.get("kv_disk_pending_blocks"):
            return info
        time.sleep(0.05)


def make_engine(args: argparse.Namespace, folder: str | None, pool: int) -> Engine:
    kwargs: dict[str, Any] = {"max_total_tokens": pool, "log_level": "warning",
                              "kv_cache_dtype": args.kv_cache_dtype}
    if args.model_path:
        kwargs["model_path"] = args.model_path
    if folder is not None:
        kwargs.update(kv_cache_dir=folder, kv_cache_disk_block_size=args.block_size,
                      kv_cache_disk_write_policy=args.write_policy)
    return Engine(**kwargs)


def warm_up(eng: Engine, vocab: int) -> None:
    """A short unrelated request: the first step's one-time costs are not a TTFT."""
    eng.generate(input_ids=random_ids(999, 64, vocab), sampling_params=ONE_TOKEN)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model-path", default=None, help="default: the default model")
    p.add_argument("--prefix-len", type=int, default=8000)
    p.add_argument("--kv-cache-dtype", default="auto", help="the pool's (and disk tier's) format")
    p.add_argument("--suffix-len", type=int, default=32)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--write-policy", default="write_through",
                   choices=["write_through", "write_back"])
    p.add_argument("--small-pool", type=int, default=None,
                   help="KV slots of the eviction scenario (default: 1.3 x one prompt)")
    p.add_argument("--baseline", action="store_true", help="also a cold run without disk tier")
    p.add_argument("--warm-page-cache", action="store_true",
                   help="keep the block files in the OS page cache before the restart")
    p.add_argument("--dir", default=None, help="disk tier folder (default: a temporary one)")
    args = p.parse_args()

    total = args.prefix_len + args.suffix_len
    pool = args.small_pool or int(1.3 * total) + 64
    root = args.dir or tempfile.mkdtemp(prefix="radixlm-kvdisk-")
    rows: list[tuple[str, float, dict[str, Any]]] = []
    try:
        if args.baseline:
            with make_engine(args, None, pool) as eng:
                vocab = eng.model_info["vocab_size"]
                warm_up(eng, vocab)
                prefix = random_ids(1, args.prefix_len, vocab)
                suffix = random_ids(2, args.suffix_len, vocab)
                rows.append(("cold, no disk tier", *ttft(eng, prefix + suffix)))
        with make_engine(args, root, pool) as eng:
            vocab = eng.model_info["vocab_size"]
            prefix = random_ids(1, args.prefix_len, vocab)

            def suffix(seed: int) -> list[int]:
                return random_ids(seed, args.suffix_len, vocab)

            warm_up(eng, vocab)
            rows.append(("cold (disk tier on)", *ttft(eng, prefix + suffix(2))))
            rows.append(("pool hit", *ttft(eng, prefix + suffix(3))))
            rows.append(("cold 2 (evicts the prefix)", *ttft(eng, random_ids(6, total, vocab))))
            rows.append(("evicted from the pool: disk hit", *ttft(eng, prefix + suffix(4))))
            info = wait_written(eng)
        dropped = 0 if args.warm_page_cache else drop_page_cache(root)
        with make_engine(args, root, pool) as eng:
            warm_up(eng, vocab)
            rows.append(("restart: disk hit", *ttft(eng, prefix + suffix(5))))
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)

    print(f"\nmodel: {args.model_path or 'default (SmolLM2-135M-Instruct)'}; prefix "
          f"{args.prefix_len} + suffix {args.suffix_len} tokens; blocks of {args.block_size}; "
          f"{args.write_policy}; pool {pool} slots")
    print(f"disk tier before the restart: {info['kv_disk_blocks']} blocks, "
          f"{info['kv_disk_bytes'] / (1 << 20):.1f} MiB; page cache "
          f"{'kept' if args.warm_page_cache else f'dropped for {dropped} files'}")
    cold = next(t for name, t, _ in rows if name.startswith("cold (disk"))
    print("\n| scenario | TTFT (s) | vs cold | cached tokens (pool / disk) |")
    print("|---|---|---|---|")
    for name, t, meta in rows:
        print(f"| {name} | {t:.3f} | {t / cold:.3f} | {meta['cached_tokens_pool']} / "
              f"{meta['cached_tokens_disk']} |")

if __name__ == "__main__":
    main()
