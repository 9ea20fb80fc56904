"""Every GGUF family loads quantized: a Q8_0 file of each architecture gguf_arch maps
(_gguf_writer.py writes them as llama.cpp's converter does) keeps its block-quantized
tensors packed (linear layers, experts, embedding, LM head: no float copy), with
gguf_arch's fix-ups (Q/K un-permutation, expert slices, Phi-3's fused tensors) applied
to the blocks. Against the same file dequantized to float32 (the float path), over a
prefill and decode steps:
- the packed weights multiplied in float32 give the float path's logits (the loading);
- the kernels give what float32 matmuls over the input rounded to Q8_0 blocks give (the
  int8 activations, as llama.cpp rounds them: the only difference from the float path);
- and the next tokens mostly agree with the float path's (these tiny random models
  amplify the activations' rounding: up to ~12% of the largest logit for Gemma 3 and
  Qwen3-MoE, ~2% for the others).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "models"))
from _forward_harness import PoolRunner, build_hf_model, perturb_weights  # noqa: E402
from _gguf_writer import write_gguf  # noqa: E402
from test_gguf_arch import CASES  # noqa: E402

from radixlm.layers.cpu_kernels import load_cpu_kernels  # noqa: E402
from radixlm.layers.linear import _LinearBase  # noqa: E402
from radixlm.layers.prepared_weight import (
    QuantWeight,  # noqa: E402
    prepare_model,  # noqa: E402
)
from radixlm.layers.vocab_embedding import VocabParallelEmbedding  # noqa: E402
from radixlm.model_loader.gguf_convert import write_config_and_link  # noqa: E402
from radixlm.model_loader.loader import load_model  # noqa: E402
from radixlm.models import layer_stack  # noqa: E402

if load_cpu_kernels() is None and os.environ.get("CI"):
    raise RuntimeError("CI: the CPU kernels must be built for the quantized GGUF tests")
pytestmark = pytest.mark.skipif(load_cpu_kernels() is None, reason="CPU kernels are not built")

# Measured here (AVX-512 and RADIXLM_ISA=avx2): the first two within 3e-6 of the largest
# logit; top-1 agreement with the float path >= 0.86.
EXACT_TOL, MIN_AGREEMENT = 1e-4, 0.8


def _float_matmul(self: QuantWeight, x: torch.Tensor, bias: torch.Tensor | None,
                  round_input: bool) -> torch.Tensor:
    """QuantWeight.apply in float32: the dequantized weight, and with round_input the
    input rounded as llama.cpp's Q8_0 does (scale max|x| / 127 stored as fp16)."""
    x = x.float()
    if round_input:
        blocks = x.reshape(-1, 32)
        d = blocks.abs().amax(-1, keepdim=True) / 127
        q = torch.round(blocks / torch.where(d == 0, torch.ones_like(d), d))
        x = (q * d.half().float()).reshape(x.shape)
    out = x @ self.dequantize().T
    return out + bias if bias is not None else out


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a - ref).abs().max() / ref.abs().max()).item()


def _logits(model, config, ids: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    runner = PoolRunner(model, config, num_slots=len(ids) + 8, max_requests=1,
                        max_context=len(ids) + 8, backend="cpu_paged")
    row = runner.new_request()
    prefill = runner.step([(row, ids[:-4])])[0]
    decodes = [runner.step([(row, [t])])[0] for t in ids[-4:]]
    return torch.cat([prefill, *decodes])


@pytest.mark.parametrize("name", sorted(CASES))
def test_family_loads_quantized(name: str, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    model_type, overrides, context_len = CASES[name]
    hf = perturb_weights(build_hf_model(model_type, **overrides), extra=("mlp.gate.weight",))
    path = write_gguf(hf, tmp_path / f"{name}.gguf", "Q8_0")
    folder = str(tmp_path / "folder")
    os.makedirs(folder)
    write_config_and_link(str(path), folder)
    floats, config = load_model(folder, torch.float32, "cpu")
    quant, _ = load_model(folder, torch.float32, "cpu", keep_quantized=True)
    prepare_model(floats, "none")
    prepare_model(quant, "gguf")
    linears = [m for m in quant.modules() if isinstance(m, _LinearBase)]
    assert linears and all(isinstance(m.prepared, QuantWeight) for m in linears), name
    assert all(m.weight.numel() == 0 for m in linears)  # no float copy kept
    embeds = [m for m in quant.modules() if type(m) is VocabParallelEmbedding]
    assert embeds and all(m.quant is not None and m.weight.numel() == 0 for m in embeds)
    assert isinstance(quant.lm_head.prepared, QuantWeight)
    # the C++ layer program takes quantized layers: only what it lacks for every format
    # (sliding windows) keeps a family in the Python loop
    reason = layer_stack.refusal(quant.model)
    assert reason is None or "window" in reason, (name, reason)
    if context_len is not None:
        floats.set_context_length(context_len)
        quant.set_context_length(context_len)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, config.vocab_size, (21,), generator=g).tolist()
    ref, got = _logits(floats, config, ids), _logits(quant, config, ids)
    agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    assert agree >= MIN_AGREEMENT, (name, agree)
    # (the C++ layer program and the MoE kernel call the quantized kernels themselves)
    quant.model.use_layer_stack = False
    for module in quant.modules():
        if hasattr(module, "_experts_loop"):
            monkeypatch.setattr(module, "_kernel_args", lambda: None)
    for round_input, expected in ((False, ref), (True, got)):
        monkeypatch.setattr(QuantWeight, "apply", lambda self, x, bias, r=round_input:
                            _float_matmul(self, x, bias, r))
        assert _rel(_logits(quant, config, ids), expected) <= EXACT_TOL, (name, round_input)
