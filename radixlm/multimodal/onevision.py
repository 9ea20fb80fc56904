"""LLaVA-OneVision's multimodal processor; it needs no torchvision.

transformers' LlavaOnevisionProcessor cannot be built without torchvision (its
video processor needs it; the image processor has a PIL backend), and calling
it per item would be wrong anyway: ONE image in a prompt is tiled (anyres),
while each of SEVERAL images is padded to a square and takes one tile plus a
newline. So, per prompt, this processor:

1. loads every image and video and counts each one's placeholder tokens with
   the model's VisionSpec (models/llava.py: the arithmetic of transformers'
   processor, which the model's features follow), refusing a prompt past the
   context length before any pixel is processed;
2. runs the image processor (AutoImageProcessor) once on all the prompt's
   images, as transformers' processor does (each image's pixels still depend
   on that image and the number of images only: every image of several has
   one tile, so none is padded to a neighbour's tile count);
3. runs each video through transformers' video processor where it loads, else
   through `VideoFrameProcessor`, the same operations written in torch.

NOTE: the counts come from config.json (vision image_size and patch_size,
image_grid_pinpoints, vision_aspect_ratio), transformers' processor takes them
from its own files (num_image_tokens, the image processor's pinpoints); the
checkpoints carry the same values in both, and the model follows config.json.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

from radixlm.messages.mm_inputs import MultimodalItem
from radixlm.multimodal.processor import (
    HFMultimodalProcessor,
    context_error,
    make_item,
    read_json,
)

if TYPE_CHECKING:
    from radixlm.models.llava import VisionSpec

logger = logging.getLogger(__name__)

# transformers' LlavaOnevisionVideoProcessor defaults (video_processing_llava_onevision.py).
_CLIP_MEAN = tuple(OPENAI_CLIP_MEAN)
_CLIP_STD = tuple(OPENAI_CLIP_STD)
_BICUBIC = int(Image.Resampling.BICUBIC)


@dataclass(frozen=True)
class VideoFrameProcessor:
    """transformers' LlavaOnevisionVideoProcessor as its torchvision backend runs on the CPU.

    Frames [F, 3, H, W] uint8 → resized by `F.interpolate(bicubic, antialias=True)` on the
    uint8 tensor (torchvision's native uint8 path on the CPU) → float32, rescaled and
    normalized in one step: (x - mean / rescale_factor) / (std / rescale_factor).
    Frames arrive as RGB (MediaLoader), so `do_convert_rgb` changes nothing.
    """

    height: int = 384
    width: int = 384
    do_resize: bool = True
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, ...] = _CLIP_MEAN
    image_std: tuple[float, ...] = _CLIP_STD

    @classmethod
    def from_dict(cls, settings: dict[str, Any]) -> VideoFrameProcessor:
        """From a video processor config; ValueError for a setting it cannot reproduce."""
        size = settings.get("size") or {"height": cls.height, "width": cls.width}
        if "height" not in size or "width" not in size:
            raise ValueError(f"video size {size} is not a fixed height and width")
        if int(settings.get("resample", _BICUBIC)) != _BICUBIC:
            raise ValueError(f"video resample {settings['resample']} is not bicubic")
        if settings.get("do_center_crop"):
            raise ValueError("video center crop is not supported")
        return cls(
            height=int(size["height"]),
            width=int(size["width"]),
            do_resize=bool(settings.get("do_resize", True)),
            do_rescale=bool(settings.get("do_rescale", True)),
            rescale_factor=float(settings.get("rescale_factor", 1 / 255)),
            do_normalize=bool(settings.get("do_normalize", True)),
            image_mean=_per_channel(settings.get("image_mean", _CLIP_MEAN)),
            image_std=_per_channel(settings.get("image_std", _CLIP_STD)),
        )

    @classmethod
    def from_pretrained(cls, model_dir: str) -> VideoFrameProcessor:
        """Settings found as transformers finds them: processor_config.json's
        "video_processor", else video_preprocessor_config.json, else preprocessor_config.json."""
        nested = read_json(model_dir, "processor_config.json")
        if isinstance(nested.get("video_processor"), dict):
            return cls.from_dict(nested["video_processor"])
        for name in ("video_preprocessor_config.json", "preprocessor_config.json"):
            if os.path.isfile(os.path.join(model_dir, name)):
                return cls.from_dict(read_json(model_dir, name))
        return cls()

    def __call__(self, frames: Sequence[Image.Image]) -> torch.Tensor:
        """RGB frames of one size → pixel_values [F, 3, height, width] (float32)."""
        if len({f.size for f in frames}) != 1:
            raise ValueError("the frames of a video must all have one size")
        video = torch.from_numpy(np.stack([np.asarray(f.convert("RGB")) for f in frames]))
        video = video.permute(0, 3, 1, 2).contiguous()  # [F, 3, H, W] uint8
        if self.do_resize and tuple(video.shape[-2:]) != (self.height, self.width):
            video = F.interpolate(video, size=[self.height, self.width], mode="bicubic",
                                  align_corners=False, antialias=True)  # [F, 3, h, w] uint8
        if self.do_normalize:
            scale = 1.0 / self.rescale_factor if self.do_rescale else 1.0
            mean = torch.tensor(self.image_mean, dtype=torch.float32) * scale  # [3]
            std = torch.tensor(self.image_std, dtype=torch.float32) * scale  # [3]
            return (video.float() - mean[:, None, None]) / std[:, None, None]
        if self.do_rescale:
            return video * self.rescale_factor
        return video.float()


class OnevisionPieces(NamedTuple):
    spec: VisionSpec  # placeholder counts
    image_processor: Any  # transformers' image processor
    process_video: Callable[[list[Image.Image]], torch.Tensor] | None  # frames → [F, 3, S, S]
    video_error: str | None  # why process_video is None


class _Media(NamedTuple):
    modality: str  # "image" | "video"
    number: int  # 1-based among the prompt's items of its modality (for error messages)
    data: Any  # an RGB image, or a video's RGB frames
    size: tuple[int, int]  # (height, width)


class OnevisionProcessor(HFMultimodalProcessor):
    """LLaVA-OneVision: a prompt's images processed together, counts from the VisionSpec."""

    def _build(self) -> OnevisionPieces:
        from transformers import AutoConfig, AutoImageProcessor

        from radixlm.models.llava import LlavaForConditionalGeneration
        from radixlm.models.registry import get_model_class

        config = AutoConfig.from_pretrained(self.model_dir)
        model_cls = get_model_class(config)
        if not issubclass(model_cls, LlavaForConditionalGeneration):
            raise ValueError(f"{model_cls.__name__} is not a LLaVA-family model")
        spec = model_cls.get_vision_spec(config)
        image_processor = AutoImageProcessor.from_pretrained(self.model_dir)
        process_video, video_error = None, None
        if self.video_token_id is not None:
            try:
                process_video = self._video_processor()
            except Exception as e:  # noqa: BLE001 - only video requests fail, with the reason
                logger.exception("The video processor of %s could not be built", self.model_dir)
                video_error = f"{type(e).__name__}: {e}"
        return OnevisionPieces(spec, image_processor, process_video, video_error)

    def _video_processor(self) -> Callable[[list[Image.Image]], torch.Tensor]:
        """transformers' video processor where it loads (it needs torchvision), else ours."""
        try:
            from transformers import AutoVideoProcessor

            hf = AutoVideoProcessor.from_pretrained(self.model_dir)
        except Exception as e:  # noqa: BLE001 - ImportError, or a torchvision that does not load
            logger.info("Using radixlm's video frame processor (%s: %s)", type(e).__name__, e)
            return VideoFrameProcessor.from_pretrained(self.model_dir)

        def process(frames: list[Image.Image]) -> torch.Tensor:
            return hf(videos=[frames], return_tensors="pt")["pixel_values_videos"][0]

        return process

    def _expand_all(self, hf: Any, places: list[tuple[int, str]], sources: dict[str, list[Any]],
                    vocab_size: int, num_text: int, context_len: int
                    ) -> Iterator[tuple[list[int], MultimodalItem]]:
        pieces: OnevisionPieces = hf
        media = self._load_all(places, sources)
        num_images = sum(m.modality == "image" for m in media)
        counts = [pieces.spec.num_image_tokens(m.size, num_images) if m.modality == "image"
                  else pieces.spec.num_video_tokens(len(m.data)) for m in media]
        if num_text + sum(counts) >= context_len:
            raise context_error(len(counts), sum(counts), num_text + sum(counts), context_len)
        images = iter(self._image_pixels(pieces, [m.data for m in media if m.modality == "image"]))
        for m, count in zip(media, counts):
            if m.modality == "image":
                pixel_values, extra = next(images)
            else:
                with _labelled(m.modality, m.number):
                    pixel_values, extra = self._video_pixels(pieces, m.data), {}
            item = make_item(m.modality, pixel_values, extra, m.size, count, vocab_size)
            yield [item.pad_value] * count, item

    def _load_all(self, places: list[tuple[int, str]], sources: dict[str, list[Any]]
                  ) -> list[_Media]:
        """Every placeholder's image or frames, in prompt order."""
        media = []
        numbers = {"image": 0, "video": 0}
        for _, modality in places:
            source = sources[modality][numbers[modality]]
            numbers[modality] += 1
            with _labelled(modality, numbers[modality]):
                data, size = self._load_media(modality, source)
            media.append(_Media(modality, numbers[modality], data, size))
        return media

    def _image_pixels(self, pieces: OnevisionPieces, images: list[Image.Image]
                      ) -> list[tuple[torch.Tensor, dict[str, Any]]]:
        """Per image: pixel_values [num_tiles, 3, S, S] and {"image_sizes": [2]}."""
        if not images:
            return []
        try:  # NOTE: nested: the images of ONE prompt (batch_num_images == [len(images)])
            out = pieces.image_processor([images], return_tensors="pt")
        except (ValueError, TypeError, OSError, RuntimeError) as e:
            raise ValueError(f"The model's image processor rejected the images: {e}") from e
        return [(out["pixel_values"][i], {"image_sizes": out["image_sizes"][i]})
                for i in range(len(images))]

    def _video_pixels(self, pieces: OnevisionPieces, frames: list[Image.Image]) -> torch.Tensor:
        if pieces.process_video is None:
            raise ValueError(f"The video processor of {self.model_name} could not be loaded "
                             f"({pieces.video_error})")
        try:
            return pieces.process_video(frames)
        except (TypeError, OSError, RuntimeError) as e:
            raise ValueError(f"The model's video processor rejected it: {e}") from e


def _per_channel(value: float | Sequence[float]) -> tuple[float, ...]:
    """A config's mean or std: one value for all three channels, or one per channel."""
    if isinstance(value, int | float):
        return (float(value),) * 3
    return tuple(float(v) for v in value)


@contextmanager
def _labelled(modality: str, number: int) -> Iterator[None]:
    """Prefix a ValueError raised inside with the item it is about ("Image 2: ...")."""
    try:
        yield
    except ValueError as e:
        raise ValueError(f"{modality.capitalize()} {number}: {e}") from e
