"""The C++ CPU kernels (radixlm/csrc/), registered as torch.ops.radixlm.*.

    python -m radixlm.layers.cpu_kernels      # load (building if need be), say which

They hold what no maintained library offers in the shape radixlm needs: paged
attention that reads K/V in place from the pool (csrc/attention*), the fused
element-wise passes (csrc/elementwise*), the per-token glue around `torch._int_mm`
for W8A8 linears (csrc/int8*), the small-batch and bf16 pairs linear kernels and the
C++ layer stack. One library serves every x86-64 CPU with AVX2: each kernel is
compiled once per ISA level (avx2, avx512, avx512bf16) and the level is picked at
run time (csrc/isa.h; `RADIXLM_ISA=avx2` caps it; `torch.ops.radixlm.isa()` names it).

Where the library comes from (`load_cpu_kernels`, once per process):
1. built at install: `pip install .`, `pip install -e .` and wheels compile it
   (setup.py) into radixlm/_cpu_kernels*.so, with a stamp of the sources and the
   torch version it was built from;
2. otherwise built here, at first use, with torch's cpp_extension into
   `$RADIXLM_CACHE_DIR/kernels/<key>` (default ~/.cache/radixlm): for a CPU the
   portable build does not cover (no AVX2, or not x86-64) a native build
   (-march=native); for a checkout that was not installed, or whose sources or
   torch changed since the install, the portable build. The key is torch's and
   Python's versions and the sources (and the CPU's flags for a native build):
   every environment with those shares one build. A server or Engine does this
   before it starts its scheduler (`prepare_cpu_kernels`), logging its progress,
   so the build has no start-up timeout over it;
3. None where it cannot be had (RADIXLM_DISABLE_CPU_KERNELS=1, no compiler, a
   failed build): callers take torch-native paths (same results, slower).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.machinery
import json
import logging
import os
import platform
import sys
import threading
import time
from collections.abc import Iterator

import torch

from radixlm.layers import kernel_build

logger = logging.getLogger(__name__)

_DISABLE_ENV = "RADIXLM_DISABLE_CPU_KERNELS"
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # radixlm/
_JIT_NAME = "radixlm_cpu_kernels"
_BUILT_MARK = "built.ok"  # written once a JIT build has linked its library
_PROGRESS_SECONDS = 30.0


def stamp_for_this_build() -> dict[str, str]:
    """What a library built from these sources against this torch is stamped with."""
    return {"sources": kernel_build.source_digest(), "torch": torch.__version__}


def installed_library() -> str | None:
    """The library `pip install` built (setup.py), where it matches these sources and
    this torch; None where there is none or it is stale."""
    path = next((p for suffix in importlib.machinery.EXTENSION_SUFFIXES
                 if os.path.exists(p := os.path.join(_PACKAGE_DIR,
                                                     kernel_build.LIBRARY_NAME + suffix))), None)
    if path is None:
        return None
    try:
        with open(os.path.join(_PACKAGE_DIR, kernel_build.STAMP_NAME)) as f:
            stamp = json.load(f)
    except (OSError, ValueError):
        stamp = {}
    expected = stamp_for_this_build()
    if not kernel_build.source_files():  # an install without the sources: trust torch's match
        expected.pop("sources")
        stamp.pop("sources", None)
    if stamp != expected:
        logger.warning("The CPU kernels built at install (%s) are from other sources or another "
                       "torch; building them for these (run `pip install -e .` again to "
                       "rebuild at install)", path)
        return None
    return path


def _jit_key(native: bool) -> str:
    """What a build here depends on, never the environment's path."""
    parts = [torch.__version__, f"py{sys.version_info[0]}.{sys.version_info[1]}",
             kernel_build.source_digest(), "native" if native else "portable"]
    if native:
        parts += [platform.machine(), " ".join(sorted(kernel_build.cpu_flags()))]
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:12]


def build_directory(native: bool | None = None) -> str:
    """Where this machine's build of the kernels goes (native: whether it is the
    -march=native one; by default the one this CPU needs)."""
    if native is None:
        native = not kernel_build.portable_build_covers_cpu()
    root = os.environ.get("RADIXLM_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "radixlm"
    )
    return os.path.join(root, "kernels", _jit_key(native))


@contextlib.contextmanager
def _build_lock(folder: str) -> Iterator[None]:
    """One builder at a time, and no stale lock left by a killed one.

    torch's cpp_extension marks a build with a `lock` file that other builders wait on
    until it disappears, forever if its builder was killed (every server start then
    hung). radixlm's builders first take an flock, which the kernel releases when its
    holder dies; whoever holds it knows a `lock` file there is stale and removes it.
    """
    with open(os.path.join(folder, "build.flock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(folder, "lock"))
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def _progress(what: str) -> Iterator[None]:
    """Log `what` is still going every _PROGRESS_SECONDS until the block ends."""
    done = threading.Event()
    start = time.monotonic()

    def report() -> None:
        while not done.wait(_PROGRESS_SECONDS):
            logger.info("%s: %.0f s so far", what, time.monotonic() - start)

    thread = threading.Thread(target=report, name="radixlm-kernel-build", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _jit_build(native: bool) -> str:
    """This machine's build of the kernels (built now unless it exists), its path."""
    from torch.utils import cpp_extension

    folder = build_directory(native)
    library = os.path.join(folder, _JIT_NAME + ".so")
    os.makedirs(folder, exist_ok=True)
    with _build_lock(folder):
        if os.path.exists(os.path.join(folder, _BUILT_MARK)) and os.path.exists(library):
            return library
        kind = "for this CPU (-march=native)" if native else "for x86-64 (avx2 .. avx512bf16)"
        logger.info("Building the CPU kernels %s in %s: a few minutes on a small machine, "
                    "once for this torch and these sources", kind, folder)
        start = time.monotonic()
        with _progress("Building the CPU kernels"):
            cpp_extension.load(name=_JIT_NAME, sources=kernel_build.sources(),
                               extra_cflags=kernel_build.cflags(native), build_directory=folder,
                               is_python_module=False, verbose=False)
        with open(os.path.join(folder, _BUILT_MARK), "w") as f:
            f.write(f"{time.monotonic() - start:.0f} s\n")
        logger.info("Built the CPU kernels in %.0f s", time.monotonic() - start)
    return library


def _find_or_build() -> tuple[str, str]:
    """(the library's path, where it came from); raises where it cannot be had."""
    covered = kernel_build.portable_build_covers_cpu()
    if covered:
        path = installed_library()
        if path is not None:
            return path, "built at install"
    else:
        logger.info("The portable CPU kernels need x86-64 with AVX2, FMA, F16C and BMI2; "
                    "this CPU (%s) gets a build of its own", platform.machine())
    return _jit_build(native=not covered), "built on this machine"


@functools.cache
def load_cpu_kernels() -> str | None:
    """Load the kernels into torch.ops.radixlm (building them first if need be); the
    library's path, or None where they cannot be had."""
    if os.environ.get(_DISABLE_ENV, "") not in ("", "0"):
        logger.info("CPU kernels disabled by %s", _DISABLE_ENV)
        return None
    try:
        path, origin = _find_or_build()
        torch.ops.load_library(path)
    except Exception as e:  # noqa: BLE001 - no compiler, a failed build: fall back
        logger.warning("CPU kernels unavailable (%s: %s); using torch-native paths",
                       type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        return None
    logger.info("CPU kernels: ISA level %s%s of %s (%s: %s)", kernel_isa(),
                " with AMX tiles (quantized weights from 16 rows)" if kernel_amx() else "",
                "/".join(torch.ops.radixlm.supported_isas()), origin, path)
    return path


def kernel_isa() -> str | None:
    """The ISA level the kernels run at (avx2, avx512, avx512bf16, native), or None
    where they are not loaded."""
    try:
        return str(torch.ops.radixlm.isa())
    except (AttributeError, RuntimeError):
        return None


def kernel_amx() -> bool:
    """Whether the quantized matmul runs batches of 16 rows and more on AMX tiles
    (csrc/quant/quant_gemm_amx.cpp: a CPU with AMX-INT8 at the avx512bf16 level;
    RADIXLM_AMX=0 turns it off)."""
    try:
        return bool(torch.ops.radixlm.amx())
    except (AttributeError, RuntimeError):
        return False


def prepare_cpu_kernels(device: str) -> None:
    """Have the kernels ready before a server or Engine starts its scheduler: a build
    (minutes, logged as it goes) then happens here, under no start-up timeout, and the
    scheduler finds it done."""
    if device == "cpu":
        load_cpu_kernels()


def use_fused_cpu_kernel(x: torch.Tensor, fuse_float32: bool = False) -> bool:
    """Whether the fused elementwise kernels (silu_and_mul, add_rms_norm,
    rotary_embedding) take `x`: CPU tensors in bfloat16 or half when the kernels are
    built, and float32 ones where the layer's `fuse_float32` is set (the bf16_weights
    mode, which `cpu_gemm.prepare_model` marks: not exact anyway, so its float32
    elementwise steps need not be torch's). Plain float32 keeps torch's own operators,
    so the exact mode stays exactly what transformers computes."""
    wanted = x.dtype in (torch.bfloat16, torch.float16) or (fuse_float32 and x.dtype == torch.float32)
    return (x.device.type == "cpu" and wanted and not torch.jit.is_scripting()
            and load_cpu_kernels() is not None)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    path = load_cpu_kernels()
    if path is None:
        sys.exit("radixlm CPU kernels could not be had (see the warning above)")
    print(f"radixlm CPU kernels ready: {path} (ISA level {kernel_isa()}"
          f"{', AMX tiles' if kernel_amx() else ''})")


if __name__ == "__main__":
    main()
