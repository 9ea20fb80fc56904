"""What the tests of the C++ CPU kernels share.

- KERNELS_MISSING: the reason a test gives when it skips because the kernels could
  not be had; with `CI` set that skip is a failure (conftest.py), so a broken kernel
  build cannot pass CI.
- The `isa_level` fixture (conftest.py): the test runs once at every ISA level the
  CPU and the build have (avx2, avx512, avx512bf16; native for a native build), so a
  machine with AVX-512 also tests the AVX2 code that AVX2-only CPUs run.
"""

from __future__ import annotations

import pytest
import torch

from radixlm.layers.cpu_kernels import load_cpu_kernels

KERNELS_MISSING = "CPU kernels not built"


def requires_kernels() -> pytest.MarkDecorator:
    """A module's or test's mark: skip (in CI: fail) where the kernels are missing."""
    return pytest.mark.skipif(load_cpu_kernels() is None, reason=KERNELS_MISSING)


def skip_without_kernels() -> None:
    if load_cpu_kernels() is None:
        pytest.skip(KERNELS_MISSING)


def isa_levels() -> list[str]:
    """The levels to run a kernel test at: every one this CPU and build have; one
    placeholder (which skips) where the kernels are missing."""
    if load_cpu_kernels() is None:
        return ["unbuilt"]
    return [str(level) for level in torch.ops.radixlm.supported_isas()]


def bf16w_skip_reason() -> str | None:
    """Why float32 over bf16 weights (csrc/bf16w_gemm.cpp) cannot run here, or None."""
    if load_cpu_kernels() is None:
        return KERNELS_MISSING
    if not bool(torch.ops.radixlm.bf16w_supported()):
        return "no AVX2/FMA at the kernels' ISA level"
    return None


def requires_bf16w() -> pytest.MarkDecorator:
    reason = bf16w_skip_reason()
    return pytest.mark.skipif(reason is not None, reason=reason or "")
