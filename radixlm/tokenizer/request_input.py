"""The native generate request, before tokenizing, and its normalization.

A request is one prompt or a batch (a list of texts or of token-id lists);
per-prompt fields may be given once for all or as a list. `normalize()`
turns it into `SingleReq`s and checks the shape; each `SingleReq` expands
into `n` samples later, in the TokenizerManager.

Media per prompt (see multimodal/media_loader.py for what a source may be):
- `image_data`: one image source or a list of them, in the order of the
  prompt's image placeholders;
- `video_data`: a list of videos (or a single video file source), where a
  video is a list of frames (image sources) or one source naming a video
  file: one video of frames is `[[f1, f2]]`, `[a, b]` is two video files.
For a batch, each is a list with one such entry per prompt (None for none),
or one value given to every prompt.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any


@dataclass
class SingleReq:
    text: str | None
    input_ids: list[int] | None
    sampling_params: dict[str, Any]
    rid: str
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    stream: bool = False
    return_text_in_logprobs: bool = True
    return_hidden_states: bool = False
    image_data: list[Any] | None = None  # image sources, in placeholder order
    video_data: list[Any] | None = None  # videos: a list of frames or a file source each
    priority: int | None = None  # with priority scheduling (see scheduler/policy.py)


@dataclass
class GenerateReqInput:
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    rid: str | list[str] | None = None
    return_logprob: bool | list[bool] = False
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    stream: bool = False
    return_text_in_logprobs: bool = True
    return_hidden_states: bool | list[bool] = False
    image_data: Any = None
    video_data: Any = None
    priority: int | list[int] | None = None

    def default_prompt_logprobs(self) -> None:
        """SGLang's native default: with return_logprob and no logprob_start_len, the
        prompt's logprobs come too, from its first position (`[null, id, text]`)."""
        if self.logprob_start_len is None and self.return_logprob:
            self.logprob_start_len = 0

    @property
    def is_batch(self) -> bool:
        if self.text is not None:
            return isinstance(self.text, list)
        ids = self.input_ids
        return isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)

    def normalize(self) -> list[SingleReq]:
        """Split into single requests; raise ValueError on a malformed request."""
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("Exactly one of 'text' or 'input_ids' must be given")
        prompts: list[Any]
        if self.text is not None:
            if isinstance(self.text, str):
                prompts = [self.text]
            elif isinstance(self.text, list) and all(isinstance(t, str) for t in self.text):
                prompts = list(self.text)
            else:
                raise ValueError("'text' must be a string or a list of strings")
        else:
            prompts = _split_ids(self.input_ids)
        if not prompts:
            raise ValueError("The batch is empty")
        n = len(prompts)
        params = _per_prompt(self.sampling_params, n, "sampling_params", dict) or [{}] * n
        rids = _per_prompt(self.rid, n, "rid", str)
        if rids is None:
            rids = [uuid.uuid4().hex for _ in range(n)]
        logprob = _per_prompt(self.return_logprob, n, "return_logprob", bool)
        starts = _per_prompt(self.logprob_start_len, n, "logprob_start_len", int)
        tops = _per_prompt(self.top_logprobs_num, n, "top_logprobs_num", int)
        hidden = _per_prompt(self.return_hidden_states, n, "return_hidden_states", bool)
        images = _per_prompt_media(self.image_data, n, self.is_batch, "image_data")
        videos = _per_prompt_media(self.video_data, n, self.is_batch, "video_data")
        priorities = _per_prompt(self.priority, n, "priority", int) or [None] * n
        out = []
        for i, prompt in enumerate(prompts):
            is_text = isinstance(prompt, str)
            out.append(
                SingleReq(
                    text=prompt if is_text else None,
                    input_ids=None if is_text else prompt,
                    sampling_params=dict(params[i] or {}),
                    rid=rids[i],
                    return_logprob=bool(logprob[i]) if logprob else False,
                    logprob_start_len=starts[i] if starts and starts[i] is not None else -1,
                    top_logprobs_num=tops[i] if tops and tops[i] is not None else 0,
                    stream=self.stream,
                    return_text_in_logprobs=self.return_text_in_logprobs,
                    return_hidden_states=bool(hidden[i]) if hidden else False,
                    image_data=images[i],
                    video_data=videos[i],
                    priority=priorities[i],
                )
            )
        return out


def _split_ids(ids: Any) -> list[list[int]]:
    if not isinstance(ids, list):
        raise ValueError("'input_ids' must be a list of token ids or a list of such lists")
    if ids and all(isinstance(x, list) for x in ids):
        batch = ids
    else:
        batch = [ids]
    for seq in batch:
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in seq):
            raise ValueError("'input_ids' must contain only integers")
    return [list(seq) for seq in batch]


def _per_prompt(value: Any, n: int, name: str, kind: type) -> list[Any] | None:
    """A value given once (broadcast) or as a list with one entry per prompt."""
    if value is None:
        return None
    if isinstance(value, list):
        if len(value) != n:
            raise ValueError(f"'{name}' has {len(value)} entries for {n} prompts")
        values = value
    else:
        values = [value] * n
    for v in values:
        if v is not None and (not isinstance(v, kind) or (kind is int and isinstance(v, bool))):
            raise ValueError(f"'{name}' must be of type {kind.__name__}")
    return values


def _per_prompt_media(value: Any, n: int, is_batch: bool, name: str) -> list[list[Any] | None]:
    """Each prompt's media as a list (None for none): a batch takes a list with one entry
    per prompt or one value for all; an entry is one source or a list of sources."""
    if value is None:
        return [None] * n
    if is_batch and isinstance(value, list):
        if len(value) != n:
            raise ValueError(f"'{name}' has {len(value)} entries for {n} prompts")
        entries = value
    else:
        entries = [value] * n
    out: list[list[Any] | None] = []
    for entry in entries:
        items = list(entry) if isinstance(entry, list | tuple) else [entry]
        out.append([x for x in items if x is not None] or None)
    return out
