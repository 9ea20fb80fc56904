"""What building the C++ CPU kernels takes: their sources, the flags, the digest that
tells a library built from other sources. Standard library only: setup.py loads this
file by its path at install time (before radixlm or torch can be imported), and
cpu_kernels.py uses it at run time, so the two builds cannot drift apart.

Two kinds of build:
- portable (x86-64 CPUs with AVX2, FMA, F16C and BMI2): every kernel body compiled
  once per ISA level under `#pragma GCC target` (csrc/isa_instantiate.h), the level
  picked at run time; no -march flag, so the library runs on any such CPU. This is
  what `pip install` builds.
- native (any other CPU: no AVX2, or not x86-64): one copy for the CPU at hand
  (-march=native, RADIXLM_ISA_NATIVE), built at first use (cpu_kernels.py).
"""

from __future__ import annotations

import hashlib
import os
import platform

SOURCE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc")
# The library's module name: radixlm/_cpu_kernels<EXT_SUFFIX> when built at install.
LIBRARY_NAME = "_cpu_kernels"
# Beside it: the digest of the sources and the torch version it was built from.
STAMP_NAME = "_cpu_kernels.stamp"
# The CPU features the portable build needs at its lowest level (csrc/isa.cpp checks
# the same ones; the pragmas of csrc/isa_instantiate.h also use BMI, LZCNT and POPCNT,
# which every CPU with these has).
PORTABLE_CPU_FLAGS = frozenset({"avx2", "fma", "f16c", "bmi2"})
# -Wno-psabi: GCC notes that a 64-byte vector returned at the avx2 level (vec_body.h, inline
# only) would be passed differently without AVX-512: true, and no call crosses levels.
# -g0: Python's own CFLAGS carry -g, which made 19 of the library's 21 MB debug info.
COMMON_CFLAGS = ["-O3", "-g0", "-fopenmp", "-Wno-psabi"]
NATIVE_CFLAGS = ["-march=native", "-DRADIXLM_ISA_NATIVE"]


def _walk(suffixes: tuple[str, ...]) -> list[str]:
    found = []
    for folder, _, names in os.walk(SOURCE_DIR):
        found += [os.path.join(folder, n) for n in names if n.endswith(suffixes)]
    return sorted(found)


def sources() -> list[str]:
    """Every translation unit under csrc/ (absolute paths, sorted)."""
    return _walk((".cpp",))


def source_files() -> list[str]:
    """The translation units and the headers they include."""
    return _walk((".cpp", ".h"))


def source_digest() -> str:
    """A digest of every source file's path (below csrc/) and contents."""
    digest = hashlib.sha1()
    for path in source_files():
        digest.update(os.path.relpath(path, SOURCE_DIR).encode() + b"\0")
        with open(path, "rb") as f:
            digest.update(f.read())
        digest.update(b"\0")
    return digest.hexdigest()


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (empty where it does not)."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return frozenset()
    return frozenset(line.partition(":")[2].split())


def is_x86_64() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def portable_build_covers_cpu(flags: frozenset[str] | None = None) -> bool:
    """Whether the portable library runs on this CPU."""
    return is_x86_64() and PORTABLE_CPU_FLAGS <= (cpu_flags() if flags is None else flags)


def cflags(native: bool) -> list[str]:
    return COMMON_CFLAGS + (NATIVE_CFLAGS if native else [])

