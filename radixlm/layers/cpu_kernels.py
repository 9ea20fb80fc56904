"""The small C++ extension of CPU kernels (radixlm/csrc/*.cpp), built once per machine.

    python -m radixlm.layers.cpu_kernels      # build now (scripts/setup.sh does)

It holds what no maintained library offers in the shape radixlm needs: paged
decode attention that reads K/V in place from the pool, the per-token
quantize/dequantize glue around `torch._int_mm` for W8A8 linears, fused
silu-and-mul / add-and-RMSNorm passes for bfloat16 steps, and (bf16_gemm.cpp) a
bfloat16 linear layer in the CPU's bf16 dot products (AVX512_BF16). It is
compiled with torch's `cpp_extension` for the CPU it runs on
(`-march=native`), into `$RADIXLM_CACHE_DIR/kernels/<torch>-<cpu>` (default
`~/.cache/radixlm`), so a machine with another CPU builds its own copy.
`load_cpu_kernels()` returns None when there is no compiler or the build
fails; callers then take the torch-native path (same results, slower).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from types import ModuleType

import torch

logger = logging.getLogger(__name__)

_SOURCES = [
    os.path.join(os.path.dirname(os.path.dirname(__file__)), "csrc", name)
    for name in ("cpu_kernels.cpp", "bf16_gemm.cpp", "bf16w_gemm.cpp", "layer_stack.cpp",
                 "isa.cpp", "prepared_linear.cpp", "quant/quant_pack.cpp",
                 "quant/quant_linear.cpp", "quant/quant_gemm_legacy.cpp", "quant/quant_gemm_k.cpp",
                 "quant/quantize.cpp")
]
_HEADERS = [os.path.join(os.path.dirname(_SOURCES[0]), name)
            for name in ("claim_parallel.h", "pairs_tiles.h", "isa.h", "isa_instantiate.h",
                         "prepared_linear.h", "quant/quant_layout.h", "quant/quant_blocks.h",
                         "quant/quant_gemm.h", "quant/quant_gemm_body.h",
                         "quant/quant_act_body.h")]
_DISABLE_ENV = "RADIXLM_DISABLE_CPU_KERNELS"


def _cpu_tag() -> str:
    """A short hash of what the build depends on: the CPU's flags, torch's version and
    install path (two virtual environments' builds differ in their include paths, and
    torch rebuilds a folder whose flags changed) and the kernel source (two checkouts
    with different sources must not share a build)."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        pass
    digest = hashlib.sha1()
    for path in _SOURCES + _HEADERS:
        try:
            with open(path, "rb") as f:
                digest.update(f.read())
        except OSError:
            pass
    source = digest.hexdigest()
    return hashlib.sha1(f"{torch.__version__}|{os.path.dirname(torch.__file__)}|{flags}|{source}".encode()).hexdigest()[:12]


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


def build_directory() -> str:
    root = os.environ.get("RADIXLM_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "radixlm"
    )
    return os.path.join(root, "kernels", _cpu_tag())


@functools.cache
def load_cpu_kernels() -> ModuleType | None:
    """The compiled module (building it first if needed), or None if it cannot be had."""
    if os.environ.get(_DISABLE_ENV, "") not in ("", "0"):
        logger.info("CPU kernels disabled by %s", _DISABLE_ENV)
        return None
    from torch.utils import cpp_extension

    folder = build_directory()
    os.makedirs(folder, exist_ok=True)
    start = time.perf_counter()
    try:
        with _build_lock(folder):
            module = cpp_extension.load(
                name="radixlm_cpu_kernels",
                sources=_SOURCES,
                extra_cflags=["-O3", "-march=native", "-fopenmp"],
                build_directory=folder,
                verbose=False,
            )
    except Exception as e:  # noqa: BLE001 - no compiler, a failed build: fall back
        logger.warning("CPU kernels unavailable (%s: %s); using torch-native paths",
                       type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        return None
    elapsed = time.perf_counter() - start
    if elapsed > 5:
        logger.info("Built the CPU kernels in %.0f s (%s)", elapsed, folder)
    return module


def use_fused_cpu_kernel(x: torch.Tensor, fuse_float32: bool = False) -> bool:
    """Whether the fused elementwise kernels (silu_and_mul, add_rms_norm,
    rotary_embedding) take `x`: CPU tensors in bfloat16 or half when the kernels are
    built, and float32 ones where the layer's `fuse_float32` is set (the bf16_weights
    mode, which `prepared_weight.prepare_model` marks: not exact anyway, so its float32
    elementwise steps need not be torch's). Plain float32 keeps torch's own operators,
    so the exact mode stays exactly what transformers computes."""
    wanted = x.dtype in (torch.bfloat16, torch.float16) or (fuse_float32 and x.dtype == torch.float32)
    return (x.device.type == "cpu" and wanted and not torch.jit.is_scripting()
            and load_cpu_kernels() is not None)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    module = load_cpu_kernels()
    if module is None:
        sys.exit("radixlm CPU kernels could not be built (see the warning above)")
    print(f"radixlm CPU kernels ready in {build_directory()}")


if __name__ == "__main__":
    main()
