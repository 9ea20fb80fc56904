"""Multimodal processors: a prompt's images and videos → expanded input ids + items.

A prompt names each image (video) with ONE placeholder token (`<image>`,
`<video>`), in the order of its `image_data` (`video_data`). The processor
loads each item (media_loader.py), runs the model's own transformers
processor on it (resize, anyres tiling, normalize), which also says how many
placeholder tokens that item takes, and splices that run into the prompt with
every placeholder replaced by the item's pad value (a hash of its pixels, see
messages/mm_inputs.py). The work runs in a small thread pool, so the TokenizerManager's
event loop never blocks. URLs are fetched first, on the event loop
(`fetch_urls`, bounded per request and in total, see media_fetcher.py), so a
slow URL never holds a worker that other requests' images wait for.

Each item goes through the processor alone, not with the request's other
images: a batched anyres processor pads every image to the most tiles of the
batch, which would make an image's pixels (and so its hash and cache sharing)
depend on its neighbours. The ids equal those of the processor called on the
whole prompt (tests/multimodal/test_processor.py checks it). OneVision is the
exception (onevision.py): there several images are processed unlike one, so
its processor works on the whole prompt's images at once.

Pluggable: `MM_PROCESSORS` maps a model architecture to its processor class;
a model without vision support gets `TextOnlyProcessor`, which refuses
images and videos with a 400 that says so.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import torch

from radixlm.messages.mm_inputs import (
    MultimodalInputs,
    MultimodalItem,
    hash_tensor,
    pad_value_for,
)
from radixlm.multimodal.media_fetcher import MediaFetcher, MediaFetchError
from radixlm.multimodal.media_loader import MAX_VIDEO_FRAMES, MediaLimits, MediaLoader, is_url
from radixlm.utils import resolve_lazy

logger = logging.getLogger(__name__)

# Outputs of a transformers processor that are not per-item model inputs.
_TEXT_KEYS = {"input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids"}


class MMResult(NamedTuple):
    input_ids: list[int]  # placeholders expanded, each item's run set to its pad value
    mm_inputs: MultimodalInputs | None  # None: no images or videos


class BaseMultimodalProcessor(ABC):
    """The TokenizerManager's multimodal front (one per server).

    `process()` returns the prompt with every placeholder expanded; the items
    satisfy the MultimodalInputs contract (sorted, disjoint, runs of pad values
    inside the returned ids). Every bad input raises ValueError with the reason.
    """

    image_token: str | None = None  # placeholder text for one image (None: no images)
    video_token: str | None = None

    @property
    def has_vision(self) -> bool:
        return self.image_token is not None

    @abstractmethod
    def check_modalities(self, num_images: int, num_videos: int) -> None:
        """Raise ValueError if the model cannot take this many images / videos at all."""

    @abstractmethod
    async def process(self, input_ids: list[int], image_data: list[Any],
                      video_data: list[Any], vocab_size: int, context_len: int) -> MMResult:
        """Expand `input_ids` for the given images and videos (lists, maybe empty)."""

    def close(self) -> None:  # noqa: B027 - an optional hook
        """Release worker threads."""


class TextOnlyProcessor(BaseMultimodalProcessor):
    """For models without a vision tower: prompts pass through, media is refused."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name

    def check_modalities(self, num_images: int, num_videos: int) -> None:
        if num_images or num_videos:
            kind = "image" if num_images else "video"
            raise ValueError(f"The model {self.model_name} has no vision support; it cannot "
                             f"take {kind} input")

    async def process(self, input_ids: list[int], image_data: list[Any],
                      video_data: list[Any], vocab_size: int, context_len: int) -> MMResult:
        self.check_modalities(len(image_data), len(video_data))
        return MMResult(input_ids, None)


class HFMultimodalProcessor(BaseMultimodalProcessor):
    """LLaVA-style models through their transformers processor (AutoProcessor).

    Works for processors whose `__call__(text=[token], images=[img])` expands
    the token into that image's run of placeholder tokens and returns
    `pixel_values` (videos: `videos=[frames]` → `pixel_values_videos`), as
    transformers' Llava, LlavaNext and LlavaOnevision processors do.
    """

    def __init__(self, model_dir: str, tokenizer: Any, config: dict[str, Any],
                 loader: MediaLoader, model_name: str, num_workers: int = 2) -> None:
        self.model_dir = model_dir
        self.loader = loader
        self.model_name = model_name
        files = _processor_files(model_dir)
        self.image_token = _placeholder(tokenizer, config, files, "image") or "<image>"
        self.video_token = _placeholder(tokenizer, config, files, "video")
        self.image_token_id = _single_token_id(tokenizer, self.image_token)
        self.video_token_id = _single_token_id(tokenizer, self.video_token)
        self._hf: Any = None
        self._load_error: str | None = None
        self._lock = threading.Lock()
        # NOTE: a fast tokenizer fails ("Already borrowed") when two threads call it at
        # once, so processor calls are serialized; loading (downloads) still overlaps.
        self._call_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(num_workers, thread_name_prefix="radixlm-mm")

    def check_modalities(self, num_images: int, num_videos: int) -> None:
        if num_images and self.image_token_id is None:
            raise ValueError(f"The tokenizer of {self.model_name} has no single "
                             f"{self.image_token!r} token for images")
        if num_videos and self.video_token_id is None:
            raise ValueError(f"The model {self.model_name} has no video support")

    async def process(self, input_ids: list[int], image_data: list[Any],
                      video_data: list[Any], vocab_size: int, context_len: int) -> MMResult:
        self.check_modalities(len(image_data), len(video_data))
        places = self._placeholders(input_ids, len(image_data), len(video_data))
        if not places:
            return MMResult(input_ids, None)
        image_data, video_data = await fetch_urls(self.loader.fetcher, image_data, video_data)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool, self._process_sync, input_ids, places, image_data, video_data,
            vocab_size, context_len)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ steps

    def _placeholders(self, input_ids: list[int], num_images: int, num_videos: int
                      ) -> list[tuple[int, str]]:
        """(position, modality) of each placeholder; raise unless one per given item."""
        places = []
        for modality, token_id, num_given in (("image", self.image_token_id, num_images),
                                              ("video", self.video_token_id, num_videos)):
            if token_id is None:
                continue
            found = [(i, modality) for i, t in enumerate(input_ids) if t == token_id]
            if len(found) != num_given:
                token = self.image_token if modality == "image" else self.video_token
                raise ValueError(
                    f"The prompt has {len(found)} {modality} placeholder(s) ({token!r}) but "
                    f"{num_given} {modality}(s) were given; put one {token!r} where each "
                    f"{modality} goes")
            places.extend(found)
        return sorted(places)

    def _process_sync(self, input_ids: list[int], places: list[tuple[int, str]],
                      image_data: list[Any], video_data: list[Any], vocab_size: int,
                      context_len: int) -> MMResult:
        hf = self._load()
        sources = {"image": image_data, "video": video_data}
        num_text = len(input_ids) - len(places)
        expansions = self._expand_all(hf, places, sources, vocab_size, num_text, context_len)
        out: list[int] = []
        items: list[MultimodalItem] = []
        last = 0
        for (pos, _), (seg, item) in zip(places, expansions):
            out.extend(input_ids[last:pos])
            last = pos + 1
            item.offset += len(out)
            out.extend(seg)
            items.append(item)
            total_len = len(out) + len(input_ids) - last
            if total_len >= context_len:
                num_mm = sum(it.num_tokens for it in items)
                raise context_error(len(items), num_mm, total_len, context_len)
        out.extend(input_ids[last:])
        return MMResult(out, MultimodalInputs(items))

    def _expand_all(self, hf: Any, places: list[tuple[int, str]], sources: dict[str, list[Any]],
                    vocab_size: int, num_text: int, context_len: int
                    ) -> Iterator[tuple[list[int], MultimodalItem]]:
        """Per placeholder, in order: its expanded ids and its item (offset within those ids).

        Lazy, so that a prompt found past the context length stops before its other items.
        num_text: the prompt's tokens other than placeholders.
        """
        numbers = {"image": 0, "video": 0}
        for _, modality in places:
            source = sources[modality][numbers[modality]]
            numbers[modality] += 1
            try:
                expansion = self._expand(hf, modality, source, vocab_size)
            except ValueError as e:
                raise ValueError(f"{modality.capitalize()} {numbers[modality]}: {e}") from e
            yield expansion

    def _expand(self, hf: Any, modality: str, source: Any, vocab_size: int
                ) -> tuple[list[int], MultimodalItem]:
        """One item through the processor alone: its expanded ids and the item."""
        media, size = self._load_media(modality, source)
        if modality == "image":
            token_id, pixel_key = self.image_token_id, "pixel_values"
            kwargs: dict[str, Any] = {"text": [self.image_token], "images": [media]}
        else:
            token_id, pixel_key = self.video_token_id, "pixel_values_videos"
            kwargs = {"text": [self.video_token], "videos": [media]}
        try:
            with self._call_lock:
                outputs = hf(**kwargs, return_tensors="pt", add_special_tokens=False)
        except (ValueError, TypeError, OSError, RuntimeError) as e:
            raise ValueError(f"The model's processor rejected it: {e}") from e
        seg = [int(t) for t in outputs["input_ids"][0].tolist()]
        run = [j for j, t in enumerate(seg) if t == token_id]
        if not run or run[-1] - run[0] + 1 != len(run):
            raise ValueError("The model's processor did not give one run of placeholders")
        pixel_values = outputs[pixel_key][0]  # drop the batch dim: [3, H, W], [n, 3, H, W]
        extra = {k: _unbatch(v) for k, v in outputs.items()
                 if k not in _TEXT_KEYS and k != pixel_key}
        item = make_item(modality, pixel_values, extra, size, len(run), vocab_size)
        item.offset = run[0]
        seg[run[0] : run[-1] + 1] = [item.pad_value] * len(run)
        return seg, item

    def _load_media(self, modality: str, source: Any) -> tuple[Any, tuple[int, int]]:
        """An RGB image, or a video's RGB frames, with its (height, width)."""
        if modality == "image":
            image = self.loader.load_image(source)
            return image, (image.height, image.width)
        frames = self.loader.load_video(source)
        if len(frames) > MAX_VIDEO_FRAMES:
            raise ValueError(f"A video may have at most {MAX_VIDEO_FRAMES} frames, "
                             f"got {len(frames)}")
        return frames, (frames[0].height, frames[0].width)

    def _load(self) -> Any:
        """What `_build()` returns, built on first use (a failure is kept and reported)."""
        with self._lock:  # two first requests at once load it once
            if self._hf is None and self._load_error is None:
                try:
                    self._hf = self._build()
                except Exception as e:  # noqa: BLE001 - reported on every media request
                    logger.exception("Loading the processor of %s failed", self.model_dir)
                    self._load_error = f"{type(e).__name__}: {e}"
            if self._hf is None:
                raise ValueError(f"The image processor of {self.model_name} could not be "
                                 f"loaded ({self._load_error})")
            return self._hf

    def _build(self) -> Any:
        """The model's transformers processor."""
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(self.model_dir)


async def fetch_urls(fetcher: MediaFetcher, image_data: list[Any], video_data: list[Any]
                     ) -> tuple[list[Any], list[Any]]:
    """The media sources with every http(s) URL replaced by its bytes (each URL fetched
    once, concurrently); ValueError "Image 2: ..." naming the first that failed."""
    labels: dict[str, str] = {}
    for modality, items in (("Image", image_data), ("Video", video_data)):
        for number, item in enumerate(items, 1):
            for source in item if isinstance(item, list | tuple) else [item]:
                if is_url(source):
                    labels.setdefault(source, f"{modality} {number}")
    if not labels:
        return image_data, video_data
    urls = list(labels)
    try:
        bodies = dict(zip(urls, await fetcher.fetch_all(urls)))
    except MediaFetchError as e:
        raise ValueError(f"{labels[urls[e.index]]}: {e}") from e

    def swap(source: Any) -> Any:
        if isinstance(source, list | tuple):
            return [swap(s) for s in source]
        return bodies.get(source, source) if isinstance(source, str) else source

    return [swap(s) for s in image_data], [swap(v) for v in video_data]


def make_item(modality: str, pixel_values: torch.Tensor, extra: dict[str, Any],
              image_size: tuple[int, int], num_tokens: int, vocab_size: int) -> MultimodalItem:
    """An item at offset 0 whose pad value is derived from its pixels and extra tensors."""
    content_hash = _content_hash(modality, pixel_values, extra)
    return MultimodalItem(modality=modality, hash=content_hash,
                          pad_value=pad_value_for(content_hash, vocab_size), offset=0,
                          num_tokens=num_tokens, pixel_values=pixel_values,
                          image_size=image_size, extra=extra)


def context_error(num_items: int, num_mm_tokens: int, total_len: int, context_len: int
                  ) -> ValueError:
    """The error for a prompt whose first num_items items take num_mm_tokens tokens and
    bring it (with all its text) to total_len tokens."""
    return ValueError(
        f"The prompt's first {num_items} image(s)/video(s) take {num_mm_tokens} tokens; with the "
        f"text it reaches {total_len} tokens, more than the context length ({context_len}) "
        f"allows; send fewer or smaller images or fewer frames")


# ---------------------------------------------------------------- registry

# Architecture → processor class, or a "module:Class" string imported on first use.
MM_PROCESSORS: dict[str, str | type[HFMultimodalProcessor]] = {
    "LlavaForConditionalGeneration": HFMultimodalProcessor,
    "LlavaNextForConditionalGeneration": HFMultimodalProcessor,
    "LlavaOnevisionForConditionalGeneration": "radixlm.multimodal.onevision:OnevisionProcessor",
}


def read_model_config(model_dir: str) -> dict[str, Any]:
    """config.json of the model folder ({} when there is none)."""
    return read_json(model_dir, "config.json")


def has_vision_support(config: dict[str, Any]) -> bool:
    """A registered multimodal architecture, or any config with a vision tower."""
    archs = config.get("architectures") or []
    return any(a in MM_PROCESSORS for a in archs) or "vision_config" in config


def create_mm_processor(args: Any, model_dir: str, tokenizer: Any) -> BaseMultimodalProcessor:
    """The processor for the model in `model_dir` (args: ServerArgs)."""
    config = read_model_config(model_dir)
    if not has_vision_support(config):
        return TextOnlyProcessor(args.model_name)
    archs = config.get("architectures") or []
    entry = next((MM_PROCESSORS[a] for a in archs if a in MM_PROCESSORS), HFMultimodalProcessor)
    cls = _resolve(entry)
    return cls(model_dir, tokenizer, config, MediaLoader(MediaLimits.from_server_args(args)),
               args.model_name)


# ---------------------------------------------------------------- helpers


def _resolve(entry: str | type[HFMultimodalProcessor]) -> type[HFMultimodalProcessor]:
    cls: type[HFMultimodalProcessor] = resolve_lazy(entry)
    return cls


def _processor_files(model_dir: str) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for name in ("preprocessor_config.json", "processor_config.json"):
        merged.update(read_json(model_dir, name))
    return merged


def read_json(model_dir: str, name: str) -> dict[str, Any]:
    """The JSON object in model_dir/name ({} when there is none)."""
    path = os.path.join(model_dir, name)
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def _placeholder(tokenizer: Any, config: dict[str, Any], files: dict[str, Any],
                 modality: str) -> str | None:
    """The placeholder text: the processor files' `<modality>_token`, else the token of the
    config's `<modality>_token_index` / `<modality>_token_id`."""
    if isinstance(files.get(f"{modality}_token"), str):
        return str(files[f"{modality}_token"])
    token_id = config.get(f"{modality}_token_index", config.get(f"{modality}_token_id"))
    if isinstance(token_id, int) and 0 <= token_id < len(tokenizer):
        return str(tokenizer.convert_ids_to_tokens(token_id))
    return None


def _single_token_id(tokenizer: Any, token: str | None) -> int | None:
    """The id of `token` if the tokenizer encodes it as one token (an added token)."""
    if token is None:
        return None
    ids = tokenizer.encode(token, add_special_tokens=False)
    if len(ids) == 1:
        return int(ids[0])
    token_id = tokenizer.convert_tokens_to_ids(token)
    return int(token_id) if token_id in ids else None


def _unbatch(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == 1:
        return value[0]
    return value


def _content_hash(modality: str, pixel_values: torch.Tensor, extra: dict[str, Any]) -> int:
    """64-bit hash of the item's processed pixels and its other tensors (e.g. image_sizes)."""
    h = hashlib.blake2b(modality.encode(), digest_size=8)
    h.update(hash_tensor(pixel_values).to_bytes(8, "little"))
    for key in sorted(extra):
        if isinstance(extra[key], torch.Tensor):
            h.update(key.encode())
            h.update(hash_tensor(extra[key]).to_bytes(8, "little"))
    return int.from_bytes(h.digest(), "little")
