"""A failed start leaves nothing behind: after `Engine()` raises EngineDeadError (a model
the registry refuses), a second Engine in the same process starts and generates.

The scenario runs in a fresh interpreter with a deadline: the bug it guards against is a
hang for good (a garbage-collected ZMQ context of the failed Engine blocking in term()),
which must fail this test instead of stalling the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "entrypoints"))
from _tiny_checkpoints import build_qwen2  # noqa: E402

SCENARIO = """
import gc, sys
import psutil
from radixlm import Engine
from radixlm.tokenizer.tokenizer_manager import EngineDeadError

bad, good = sys.argv[1], sys.argv[2]
try:
    Engine(model_path=bad, max_total_tokens=256)
    raise SystemExit("the bad model started")
except EngineDeadError as e:
    assert "unsupported model architecture" in str(e), e
# Every child of the failed Engine is gone; its context was not left to the collector.
assert not psutil.Process().children(recursive=True), psutil.Process().children()
gc.collect()
with Engine(model_path=good, max_total_tokens=256) as engine:
    out = engine.generate("hello", {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True})
    assert out["meta_info"]["completion_tokens"] == 3, out
assert not psutil.Process().children(recursive=True)
print("OK")
"""


def test_bad_model_then_good_model_in_one_process(tmp_path: Path) -> None:
    good = build_qwen2(tmp_path / "good")
    bad = build_qwen2(tmp_path / "bad")
    config = json.loads((bad / "config.json").read_text())
    config["architectures"] = ["NoSuchForCausalLM"]
    (bad / "config.json").write_text(json.dumps(config))
    proc = subprocess.run([sys.executable, "-c", SCENARIO, str(bad), str(good)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), (
        proc.stdout[-2000:] + proc.stderr[-4000:])
