"""Tiny random LLaVA-family checkpoints, their transformers processors, and prompts.

Each architecture gets a word-level tokenizer whose "<image>" / "<video>"
ids are the config's placeholder ids, a transformers image processor, and the
transformers processor that expands placeholders. Prompts are expanded by the
processor's own `replace_image_token` / `replace_video_token`, so token counts
are transformers', then turned into radixlm's form: each placeholder run
replaced by its item's pad value, with one `MultimodalItem` per run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from _forward_harness import perturb_weights
from PIL import Image
from torch import nn

from radixlm.messages.mm_inputs import (
    MultimodalInputs,
    MultimodalItem,
    hash_tensor,
    pad_value_for,
)

VOCAB_SIZE = 320
IMAGE_TOKEN_ID = 300
VIDEO_TOKEN_ID = 301
TILE = 32  # vision image_size: 4 x 4 patches of 8 pixels
PATCH = 8
PINPOINTS = [[32, 64], [64, 32], [64, 64], [32, 96], [96, 32]]

TEXT = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    initializer_range=0.1,
)
VISION = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    image_size=TILE,
    patch_size=PATCH,
)

# transformers model_type → config values of its tiny test checkpoint
ARCHS: dict[str, dict[str, Any]] = {
    "llava": dict(  # CLIP, CLS dropped, layer -2 (the last layer is never run)
        text_config=dict(TEXT, model_type="llama"),
        vision_config=dict(VISION, model_type="clip_vision_model"),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
    ),
    "llava_next": dict(  # two feature layers concatenated, untied head
        text_config=dict(TEXT, model_type="llama"),
        vision_config=dict(VISION, model_type="clip_vision_model"),
        vision_feature_layer=[-3, -1],
        vision_feature_select_strategy="default",
        image_grid_pinpoints=PINPOINTS,
    ),
    "llava_onevision": dict(  # SigLIP, Qwen2 with a tied head, at most ~1 tile of features
        text_config=dict(TEXT, model_type="qwen2", tie_word_embeddings=True),
        vision_config=dict(VISION, model_type="siglip_vision_model"),
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
        image_grid_pinpoints=PINPOINTS,
        vision_aspect_ratio="anyres_max_1",
        video_token_index=VIDEO_TOKEN_ID,
    ),
}


def build_hf_llava(
    arch: str, seed: int = 0, image_token_id: int = IMAGE_TOKEN_ID, **overrides: Any
) -> nn.Module:
    """A random transformers model of this architecture, with non-trivial norms and biases
    (overrides: config values that replace those of ARCHS[arch])."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    config_values = {**ARCHS[arch], **overrides}
    config = AutoConfig.for_model(arch, image_token_index=image_token_id, **config_values)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, attn_implementation="eager")
    # Projector and newline weights as large as token embeddings.
    return perturb_weights(model, extra=("projector", "image_newline"))


def build_tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, **{f"w{i}": i for i in range(1, IMAGE_TOKEN_ID)}}
    vocab.update({"<image>": IMAGE_TOKEN_ID, "<video>": VIDEO_TOKEN_ID})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", additional_special_tokens=["<image>", "<video>"]
    )


def build_processor(arch: str) -> Any:
    """transformers' processor for arch (OneVision's without its video processor, which
    needs torchvision: only its token counting is used)."""
    from transformers import (
        CLIPImageProcessorPil,
        LlavaNextImageProcessorPil,
        LlavaNextProcessor,
        LlavaOnevisionImageProcessorPil,
        LlavaOnevisionProcessor,
        LlavaProcessor,
    )

    square = {"height": TILE, "width": TILE}
    common = dict(patch_size=PATCH, vision_feature_select_strategy="default")
    if arch == "llava":
        image_processor = CLIPImageProcessorPil(size={"shortest_edge": TILE}, crop_size=square)
        return LlavaProcessor(
            image_processor, build_tokenizer(), num_additional_image_tokens=1, **common
        )
    if arch == "llava_next":
        image_processor = LlavaNextImageProcessorPil(
            size={"shortest_edge": TILE}, crop_size=square, image_grid_pinpoints=PINPOINTS
        )
        return LlavaNextProcessor(
            image_processor, build_tokenizer(), num_additional_image_tokens=1, **common
        )
    processor = LlavaOnevisionProcessor.__new__(LlavaOnevisionProcessor)
    processor.image_processor = LlavaOnevisionImageProcessorPil(
        size=square, image_grid_pinpoints=PINPOINTS
    )
    processor.num_image_tokens = (TILE // PATCH) ** 2
    processor.vision_feature_select_strategy = "full"
    processor.vision_aspect_ratio = ARCHS[arch]["vision_aspect_ratio"]
    processor.image_token, processor.video_token = "<image>", "<video>"
    return processor


def random_image(height: int, width: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def random_frames(num_frames: int, seed: int) -> torch.Tensor:
    """Normalized video frames [F, 3, TILE, TILE] (what a video processor returns)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(num_frames, 3, TILE, TILE, generator=g)


class Prompt(NamedTuple):
    hf_ids: list[int]  # placeholders as the image / video token ids (transformers' input)
    ids: list[int]  # placeholders as pad values (radixlm's input)
    mm: MultimodalInputs
    hf_inputs: dict[str, Any]  # pixel tensors for transformers' forward


def make_prompt(
    arch: str,
    text: str,
    images: Sequence[Image.Image] = (),
    frames: torch.Tensor | None = None,
) -> Prompt:
    """Expand "<image>" / "<video>" in text with the processor, and build both models' inputs."""
    processor = build_processor(arch)
    image_inputs: dict[str, Any] = {}
    hf_inputs: dict[str, Any] = {}
    if images:
        batch = [list(images)] if arch == "llava_onevision" else list(images)
        image_inputs = dict(processor.image_processor(batch, return_tensors="pt"))
        hf_inputs = dict(image_inputs)
    if frames is not None:
        hf_inputs["pixel_values_videos"] = frames[None]
    pieces, num_images = [], 0
    for part in re.split(r"(<image>|<video>)", text):
        if part == "<image>":
            part = processor.replace_image_token(image_inputs, num_images)
            num_images += 1
        elif part == "<video>":
            part = processor.replace_video_token({"pixel_values_videos": frames[None]}, 0)
        pieces.append(part)
    hf_ids = build_tokenizer()("".join(pieces))["input_ids"]
    items, num_images = [], 0
    for start, end in _runs(hf_ids):
        size = None
        if hf_ids[start] == VIDEO_TOKEN_ID:
            pixels = frames
        else:
            pixels = image_inputs["pixel_values"][num_images]
            if "image_sizes" in image_inputs:
                size = tuple(image_inputs["image_sizes"][num_images].tolist())
            num_images += 1
        h = hash_tensor(pixels)
        modality = "video" if hf_ids[start] == VIDEO_TOKEN_ID else "image"
        pad_value = pad_value_for(h, VOCAB_SIZE)
        items.append(MultimodalItem(modality, h, pad_value, start, end - start, pixels, size))
    ids = list(hf_ids)
    for it in items:
        ids[it.offset : it.end] = [it.pad_value] * it.num_tokens
    return Prompt(hf_ids, ids, MultimodalInputs(items), hf_inputs)


def _runs(ids: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of placeholder ids."""
    runs: list[tuple[int, int]] = []
    for i, t in enumerate(ids):
        if t not in (IMAGE_TOKEN_ID, VIDEO_TOKEN_ID):
            continue
        if runs and runs[-1][1] == i and ids[i - 1] == t:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


@torch.no_grad()
def hf_llava_logits(model: nn.Module, prompt: Prompt) -> torch.Tensor:
    """transformers' logits for the whole prompt: [len(ids), vocab]."""
    out = model(input_ids=torch.tensor([prompt.hf_ids]), **prompt.hf_inputs)
    return out.logits[0].float()
