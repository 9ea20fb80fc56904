"""Chat messages → prompt token ids, and the images and videos they carry, in order.

- Messages become the plain dicts Hugging Face templates expect; "developer"
  is sent as "system". Without images or videos, a message's text parts are
  joined into one string.
- Each `image_url` part is one image and each `video_url` part one video (a
  file, or a list of frames); the model gets one placeholder (`<image>`,
  `<video>`) per item, where the template puts it. Two renderings are tried:
  1. parts: every content as `[{"type": "text", "text": ...}, {"type": "image"},
     {"type": "video"}]`, which multimodal HF templates (LLaVA's) expect and
     place themselves;
  2. inline: every content as one string with the placeholder text at each
     media part, for templates that take string content (chatml);
  the first whose text holds exactly one placeholder per item is used.
- A model without vision support refuses media with a 400 before rendering.
- The prompt is the rendered text tokenized without adding special tokens
  (the template already holds them); the runtime expands each placeholder. A
  text its size proves longer than the context is refused before tokenizing.
- Blocking (templates, tokenizing): the route runs it in a tokenizer worker.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from radixlm.chat_template import render_chat
from radixlm.entrypoints.http.errors import APIError
from radixlm.entrypoints.http.state import ServerState
from radixlm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    ImagePart,
    TextPart,
    VideoPart,
)
from radixlm.entrypoints.openai.tools import ToolPlan


class ChatPrompt(NamedTuple):
    text: str  # the rendered prompt
    input_ids: list[int]
    image_data: list[Any]  # image sources, in placeholder order
    video_data: list[Any]  # videos (a file source or a list of frames), in placeholder order


def build_chat_prompt(state: ServerState, req: ChatCompletionRequest,
                      tools: ToolPlan | None = None) -> ChatPrompt:
    """Token ids of the templated conversation and its media; APIError(400) on bad input.

    tools: the request's tool plan (it rewrites the messages and gives the template its
    tools); None: the request has none."""
    tm = state.tm
    images, videos = collect_media(req.messages)
    if images or videos:
        try:
            tm.mm_processor.check_modalities(len(images), len(videos))
        except ValueError as e:
            raise APIError(str(e), param="messages") from e
        text = _render_with_media(state, req, len(images), len(videos), tools)
    else:
        text = _render(state, req, message_dicts(req.messages), tools)
    try:
        tm.tokenizer_workers.check_fits(text, state.context_length or 1 << 30)
    except ValueError as e:
        raise APIError(str(e), param="messages") from e
    input_ids = list(tm.tokenizer.encode(text, add_special_tokens=False))
    return ChatPrompt(text, input_ids, images, videos)


def collect_media(messages: list[ChatMessage]) -> tuple[list[Any], list[Any]]:
    """(image sources, videos) of all messages, in order."""
    images: list[Any] = []
    videos: list[Any] = []
    for m in messages:
        for part in m.content if isinstance(m.content, list) else []:
            if isinstance(part, ImagePart):
                target = videos if part.modalities == "video" else images
                target.append(part.image_url.url)
            elif isinstance(part, VideoPart):
                videos.append(part.video_url.url)
    return images, videos


def message_dicts(messages: list[ChatMessage], mode: str = "text",
                  image_token: str = "", video_token: str = "") -> list[dict[str, Any]]:
    """The messages as template input. mode: "text" (text parts joined), "parts"
    (HF multimodal content lists) or "inline" (placeholder text at each media part)."""
    out = []
    for m in messages:
        d = m.model_dump(exclude_none=True)
        if m.role == "developer":
            d["role"] = "system"
        parts: list[Any] = ([TextPart(type="text", text=m.content)] if isinstance(m.content, str)
                            else list(m.content or []))
        if mode == "parts":
            d["content"] = [_part_dict(p) for p in parts]
        elif mode == "inline":
            d["content"] = "\n".join(_inline(p, image_token, video_token) for p in parts)
        elif isinstance(m.content, list):
            d["content"] = "\n".join(p.text for p in parts if isinstance(p, TextPart))
        d.setdefault("content", "")
        out.append(d)
    return out


def _part_dict(part: Any) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, ImagePart) and part.modalities != "video":
        return {"type": "image"}
    return {"type": "video"}


def _inline(part: Any, image_token: str, video_token: str) -> str:
    if isinstance(part, TextPart):
        return part.text
    if isinstance(part, ImagePart) and part.modalities != "video":
        return image_token
    return video_token


def _render_with_media(state: ServerState, req: ChatCompletionRequest, num_images: int,
                       num_videos: int, tools: ToolPlan | None) -> str:
    proc = state.tm.mm_processor
    image_token, video_token = proc.image_token or "", proc.video_token or ""
    text = ""
    for mode in ("parts", "inline"):
        try:
            text = _render(state, req, message_dicts(req.messages, mode, image_token,
                                                     video_token), tools)
        except APIError:
            if mode == "inline":
                raise
            continue
        images_ok = text.count(image_token) == num_images
        videos_ok = not video_token or text.count(video_token) == num_videos
        if images_ok and videos_ok:
            break
    return text  # a mismatch left here is reported by the runtime with the counts


def _render(state: ServerState, req: ChatCompletionRequest,
            messages: list[dict[str, Any]], tools: ToolPlan | None) -> str:
    assert state.chat_template is not None
    if tools is not None:
        messages = tools.messages(messages)
    try:
        return render_chat(state.chat_template, state.tm.tokenizer, messages,
                           add_generation_prompt=req.add_generation_prompt,
                           continue_final_message=req.continue_final_message,
                           tools=tools.template_tools() if tools is not None else None,
                           template_kwargs=req.chat_template_kwargs)
    except ValueError as e:
        raise APIError(str(e), param="messages") from e
