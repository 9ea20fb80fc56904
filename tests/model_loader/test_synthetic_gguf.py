"""scripts/make_synthetic_gguf.py: tiny files of each family load through radixlm (the
GGUF converter and gguf_arch's plan) and run; the real shapes have the sizes they claim."""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "models"))
from _forward_harness import PoolRunner  # noqa: E402

from radixlm.model_loader.gguf_convert import convert_gguf  # noqa: E402
from radixlm.model_loader.loader import load_model  # noqa: E402

SCRIPT = Path(__file__).parents[2] / "scripts" / "make_synthetic_gguf.py"


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_synthetic_gguf", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


# (tiny-qwen3's layers are tiny-qwen3moe's attention; each file converts SmolLM2's tokenizer)
@pytest.mark.parametrize("shape", ["tiny-llama", "tiny-qwen3moe", "tiny-gemma3"])
def test_tiny_files_load_and_run(gen: ModuleType, shape: str, tmp_path: Path) -> None:
    gen.main([shape, str(tmp_path), "q8_0"])
    (path,) = tmp_path.glob("*.gguf")
    folder = convert_gguf(str(path), str(tmp_path / "cache"))
    model, config = load_model(folder, torch.float32, "cpu")
    arch = {"tiny-llama": "LlamaForCausalLM", "tiny-qwen3": "Qwen3ForCausalLM",
            "tiny-qwen3moe": "Qwen3MoeForCausalLM", "tiny-gemma3": "Gemma3ForCausalLM"}[shape]
    assert config.architectures == [arch]
    assert config.vocab_size == 49152  # SmolLM2's tokenizer
    runner = PoolRunner(model, config)
    (logits,) = runner.step([(runner.new_request(), [1, 2, 3, 4, 5])])
    assert logits.shape == (5, 49152) and torch.isfinite(logits).all()
    if shape == "tiny-llama":  # Llama 3's rope scaling, from the rope_freqs tensor
        assert config.rope_parameters["rope_type"] == "llama3"


def _params(gen: ModuleType, name: str) -> tuple[float, float]:
    """(all parameters, those one token reads: k of the experts, the LM head) in billions."""
    shape = gen.SHAPES[name]
    total = active = 0
    for tensor, dims, _ in gen.tensors(shape):
        n = math.prod(dims)
        total += n
        if "_exps" in tensor:
            n = n * shape.active // shape.experts
        if tensor == "token_embd.weight" and not shape.tied:
            n = 0  # a lookup; the untied output matrix is what each token reads
        active += n
    return total / 1e9, active / 1e9


def test_real_shapes(gen: ModuleType) -> None:
    assert _params(gen, "qwen3-1.7b")[0] == pytest.approx(1.72, abs=0.03)
    assert _params(gen, "qwen3-0.6b")[0] == pytest.approx(0.60, abs=0.03)
    total, active = _params(gen, "qwen3moe-2b")
    assert total == pytest.approx(2.1, abs=0.1) and active == pytest.approx(0.9, abs=0.1)
    assert _params(gen, "qwen3-0.9b-dense") == pytest.approx((active, active), abs=0.005)
    total, active = _params(gen, "qwen3moe-30b-a3b")
    assert total == pytest.approx(30.5, abs=0.3) and active == pytest.approx(3.3, abs=0.3)
    assert _params(gen, "gemma3-1b")[0] == pytest.approx(1.0, abs=0.05)
    assert _params(gen, "llama-1b")[0] == pytest.approx(1.24, abs=0.03)
