"""Tiny LLaVA processor folders (no weights) and test images, built in memory.

The tokenizer is byte-level (one token per byte) plus the special tokens
`<image>` and `<video>`, with a LLaVA-style chat template that places `<image>`
for `{"type": "image"}` content parts. The image processors use 28 px crops and
14 px patches, so a LLaVA-1.5 image takes 4 placeholder tokens and a
LLaVA-NeXT image (2 x 2 or 2 x 1 tiles plus the base image) a number that
depends on its aspect ratio.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

from PIL import Image

LLAVA_TEMPLATE = (
    "{% for m in messages %}{{ m.role.upper() }}: "
    "{% if m.content is string %}{{ m.content }}{% else %}{% for c in m.content %}"
    "{% if c.type == 'image' %}<image>\n{% elif c.type == 'video' %}<video>\n"
    "{% else %}{{ c.text }}{% endif %}{% endfor %}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
NUM_LLAVA_TOKENS = 4  # (28 / 14)^2 patches + CLS - CLS ("default" feature selection)


def tiny_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for s in ("<|endoftext|>", "<image>", "<video>"):
        vocab[s] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                 unk_token="<|endoftext|>",
                                 additional_special_tokens=["<image>", "<video>"])
    hf.chat_template = LLAVA_TEMPLATE
    return hf


def build_processor_dir(path: Path, kind: str = "llava") -> Path:
    """A folder with config.json and a transformers processor: kind "llava" or "llava_next"."""
    from transformers import (
        CLIPImageProcessor,
        LlavaNextImageProcessor,
        LlavaNextProcessor,
        LlavaProcessor,
    )

    tok = tiny_tokenizer()
    common = {"patch_size": 14, "vision_feature_select_strategy": "default",
              "num_additional_image_tokens": 1, "chat_template": LLAVA_TEMPLATE}
    crop = {"height": 28, "width": 28}
    if kind == "llava":
        ip = CLIPImageProcessor(size={"shortest_edge": 28}, crop_size=crop)
        proc: Any = LlavaProcessor(image_processor=ip, tokenizer=tok, **common)
        arch = "LlavaForConditionalGeneration"
    else:
        ip = LlavaNextImageProcessor(size={"shortest_edge": 28}, crop_size=crop,
                                     image_grid_pinpoints=[[28, 56], [56, 28], [56, 56]])
        proc = LlavaNextProcessor(image_processor=ip, tokenizer=tok, **common)
        arch = "LlavaNextForConditionalGeneration"
    path.mkdir(parents=True, exist_ok=True)
    proc.save_pretrained(path)
    config = {"architectures": [arch], "image_token_index": tok.convert_tokens_to_ids("<image>"),
              "vision_config": {"model_type": "clip_vision_model"},
              "text_config": {"vocab_size": len(tok)}}
    (path / "config.json").write_text(json.dumps(config))
    return path


def png_bytes(size: tuple[int, int] = (40, 30), color: tuple[int, int, int] = (255, 0, 0)
              ) -> bytes:
    """A PNG of `size` (width, height) in one colour, with a gradient so tiles differ."""
    img = Image.new("RGB", size, color)
    for x in range(size[0]):
        img.putpixel((x, 0), (x * 5 % 256, 0, 0))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"
