"""Test-suite-wide settings.

Tests that predate reduced precision compare with float32 references
(transformers' logits, greedy tokens), so "auto" precision means float32
without quantization here; tests of bfloat16 and int8 ask for them explicitly
(tests/models/test_accuracy_gate.py).

Every Engine and server a test starts checks its KV accounting (free + cached +
held == total, with the pools' double-free and the cache's own checks) every 16
steps and whenever its scheduler goes idle; a failed check fails the scheduler,
so the test fails. Child processes inherit both variables.

Tests of the C++ kernels may take the `isa_level` fixture to run at every ISA
level the CPU has; with `CI` set, a test skipped because the kernels are missing
fails (tests/_kernels.py).
"""

from __future__ import annotations

import os

os.environ.setdefault("RADIXLM_AUTO_PRECISION", "float32")
os.environ.setdefault("RADIXLM_CHECK_INTEGRITY", "16")


from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from _kernels import KERNELS_MISSING, isa_levels, skip_without_kernels  # noqa: E402


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "isa_level" in metafunc.fixturenames:
        metafunc.parametrize("isa_level", isa_levels(), indirect=True)


@pytest.fixture
def isa_level(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the kernels at one ISA level for the test (see _kernels.py)."""
    skip_without_kernels()
    ops = torch.ops.radixlm
    original = ops.isa()
    ops.set_isa(request.param)
    try:
        yield str(request.param)
    finally:
        ops.set_isa(original)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """With CI set, a test that skipped because the C++ kernels are missing fails: a
    broken kernel build must not pass CI with the default attention backend untested."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and _in_ci() and KERNELS_MISSING in str(report.longrepr):
        report.outcome = "failed"
        report.longrepr = (f"{KERNELS_MISSING}, and CI is set: the kernels must build "
                           "(scripts/setup.sh, or `pip install -e .`; "
                           "`python -m radixlm.layers.cpu_kernels` shows why not)")
