"""Complete tiny LLaVA checkpoint folders, which `radixlm serve` and `Engine` load as is.

A folder holds what a real Hugging Face LLaVA folder holds: config.json and
random float32 weights (transformers' own model, built as in
tests/models/_llava_builders.py), the byte-level tokenizer with its LLaVA chat
template, and the transformers processor (tests/multimodal/_tiny_llava.py):
28 px tiles of 14 px patches, so a LLaVA-1.5 image takes 4 tokens and a
LLaVA-NeXT image 4 per tile, a newline per feature row, and its base tile.

`HFReference` runs transformers on the same folder (its processor expands
the prompt, its model generates), which the tests compare radixlm with.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "models"))
from _llava_builders import ARCHS, build_hf_llava  # noqa: E402
from _tiny_llava import build_processor_dir, tiny_tokenizer  # noqa: E402

NEXT_PINPOINTS = [[28, 56], [56, 28], [56, 56]]  # those of _tiny_llava's NeXT processor
# NOTE: of seeds 0-3, seed 2 gives both architectures the least repetitive greedy
# outputs (6-12 distinct tokens in 12); tests/engine/test_llava_engine.py checks it.
SEED = 2


def build_checkpoint(path: Path, arch: str, seed: int = SEED) -> Path:
    """Save a tiny random `arch` ("llava" or "llava_next") checkpoint with its
    tokenizer and processor in `path`; returns path."""
    build_processor_dir(path, arch)  # tokenizer, processor, chat template
    tok = tiny_tokenizer()
    eos = int(tok.eos_token_id)
    text = dict(ARCHS[arch]["text_config"], vocab_size=len(tok), bos_token_id=eos,
                eos_token_id=eos)
    vision = dict(ARCHS[arch]["vision_config"], image_size=28, patch_size=14)
    extra: dict[str, Any] = {"image_grid_pinpoints": NEXT_PINPOINTS} if arch == "llava_next" else {}
    model = build_hf_llava(arch, seed, image_token_id=tok.convert_tokens_to_ids("<image>"),
                           text_config=text, vision_config=vision, **extra)
    model.generation_config.eos_token_id = eos
    model.save_pretrained(path)  # config.json (replacing the processor-only one), weights
    return path


class HFResult(NamedTuple):
    input_ids: list[int]  # the prompt as transformers' processor expands it
    output_ids: list[int]  # the greedy continuation


class HFReference:
    """transformers' processor and model for a checkpoint folder, greedy, float32."""

    def __init__(self, path: Path) -> None:
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.processor = AutoProcessor.from_pretrained(path)
        self.model = AutoModelForImageTextToText.from_pretrained(
            path, dtype=torch.float32, attn_implementation="eager").eval()
        eos = self.processor.tokenizer.eos_token_id
        # radixlm runs with ignore_eos: transformers must not stop at EOS either.
        self.model.generation_config.eos_token_id = None
        self.model.generation_config.pad_token_id = eos
        self.image_token_id = int(self.model.config.image_token_id)

    def inputs(self, text: str, images: Sequence[Image.Image] = ()) -> dict[str, Any]:
        return dict(self.processor(text=[text], images=list(images) or None,
                                   return_tensors="pt"))

    def expand(self, text: str, images: Sequence[Image.Image] = ()) -> list[int]:
        """The prompt's ids with each image placeholder expanded (no model run)."""
        return [int(t) for t in self.inputs(text, images)["input_ids"][0].tolist()]

    def image_runs(self, text: str, images: Sequence[Image.Image]) -> list[tuple[int, int]]:
        """[start, end) of each image's placeholder run in the expanded prompt."""
        ids = self.expand(text, images)
        runs: list[tuple[int, int]] = []
        for i, t in enumerate(ids):
            if t != self.image_token_id:
                continue
            if runs and runs[-1][1] == i:
                runs[-1] = (runs[-1][0], i + 1)
            else:
                runs.append((i, i + 1))
        return runs

    @torch.no_grad()
    def generate(self, text: str, images: Sequence[Image.Image] = (),
                 max_new_tokens: int = 16) -> HFResult:
        inputs = self.inputs(text, images)
        out = self.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        prompt = inputs["input_ids"][0].tolist()
        return HFResult(prompt, out[0, len(prompt):].tolist())
