"""Where a process's resident memory is: /proc/PID/smaps_rollup, then smaps by mapping.

    python scripts/rss_breakdown.py PID [top]

Prints the rollup (RSS, anonymous, file-backed), the file-backed mappings summed by file
(shared libraries, a mapped GGUF file) and the largest anonymous mappings one by one (the
Python heap, torch's large allocations, the KV pool's buffers), in MiB. Linux only.
"""

from __future__ import annotations

import os
import re
import sys
from collections import defaultdict

_HEADER = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")


def _kib(line: str) -> int:
    return int(line.split()[1])


def read_smaps(pid: int) -> list[dict[str, object]]:
    """One dict per mapping: name, size, rss, anon, swap (KiB)."""
    maps: list[dict[str, object]] = []
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if _HEADER.match(line):
                parts = line.split(maxsplit=5)
                maps.append({"name": parts[5].strip() if len(parts) > 5 else "",
                             "size": 0, "rss": 0, "anon": 0, "swap": 0})
            elif maps and line.startswith(("Size:", "Rss:", "Anonymous:", "Swap:")):
                key = {"Size:": "size", "Rss:": "rss", "Anonymous:": "anon",
                       "Swap:": "swap"}[line.split()[0]]
                maps[-1][key] = _kib(line)
    return maps


def report(pid: int, top: int = 12) -> str:
    out: list[str] = []
    with open(f"/proc/{pid}/smaps_rollup") as f:
        rollup = {ln.split()[0].rstrip(":"): _kib(ln) for ln in f if ln.endswith("kB\n")}
    rss, anon = rollup.get("Rss", 0), rollup.get("Anonymous", 0)
    out.append(f"pid {pid}: rss {rss / 1024:.0f} MiB = anonymous {anon / 1024:.0f} + "
               f"file/shmem {(rss - anon) / 1024:.0f} (private dirty "
               f"{rollup.get('Private_Dirty', 0) / 1024:.0f}, clean "
               f"{(rollup.get('Private_Clean', 0) + rollup.get('Shared_Clean', 0)) / 1024:.0f})")
    maps = read_smaps(pid)
    by_file: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    anon_maps: list[dict[str, object]] = []
    for m in maps:
        name = str(m["name"])
        if name.startswith("/") and not name.startswith("/dev/zero"):
            entry = by_file[os.path.basename(name.removesuffix(" (deleted)"))]
            entry[0] += int(m["rss"])  # type: ignore[call-overload]
            entry[1] += int(m["anon"])  # type: ignore[call-overload]  # (copy-on-write)
            entry[2] += 1
        else:
            anon_maps.append(m)
    files = sorted(by_file.items(), key=lambda kv: -kv[1][0])
    file_rss = sum(v[0] for v in by_file.values())
    out.append(f"  file-backed mappings: {file_rss / 1024:.0f} MiB resident in {len(by_file)} "
               "files; largest:")
    for name, (r, a, n) in files[:top]:
        out.append(f"    {r / 1024:7.1f} MiB  ({a / 1024:.1f} private copies)  {n:3d} maps  {name}")
    anon_maps.sort(key=lambda m: -int(m["rss"]))  # type: ignore[call-overload]
    anon_rss = sum(int(m["rss"]) for m in anon_maps)  # type: ignore[call-overload]
    out.append(f"  anonymous mappings: {anon_rss / 1024:.0f} MiB resident in {len(anon_maps)} "
               "maps; largest:")
    for m in anon_maps[:top]:
        out.append(f"    {int(m['rss']) / 1024:7.1f} MiB of {int(m['size']) / 1024:7.1f} MiB  "  # type: ignore[call-overload]
                   f"{m['name'] or '[anon]'}")
    return "\n".join(out)


if __name__ == "__main__":
    print(report(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 12))
