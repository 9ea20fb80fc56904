"""Test-suite-wide settings.

Tests that predate reduced precision compare with float32 references
(transformers' logits, greedy tokens), so "auto" precision means float32
without quantization here; tests of bfloat16 and int8 ask for them explicitly
(tests/models/test_accuracy_gate.py). Child processes inherit the variable.
"""

import os

os.environ.setdefault("RADIXLM_AUTO_PRECISION", "float32")
