"""Test-suite-wide settings.

Tests that predate reduced precision compare with float32 references
(transformers' logits, greedy tokens), so "auto" precision means float32
without quantization here; tests of bfloat16 and int8 ask for them explicitly
(tests/models/test_accuracy_gate.py).

Every Engine and server a test starts checks its KV accounting (free + cached +
held == total, with the pools' double-free and the cache's own checks) every 16
steps and whenever its scheduler goes idle; a failed check fails the scheduler,
so the test fails. Child processes inherit both variables.
"""

from __future__ import annotations

import os

os.environ.setdefault("RADIXLM_AUTO_PRECISION", "float32")
os.environ.setdefault("RADIXLM_CHECK_INTEGRITY", "16")
