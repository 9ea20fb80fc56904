"""Every message that crosses a process boundary, as typed dataclasses.

Flow (see DESIGN.md):
    TokenizerManager --TokenizedGenerateReq/AbortReq/control--> Scheduler
    Scheduler --BatchTokenIDOut--> DetokenizerManager --BatchStrOut--> TokenizerManager
    Scheduler --control replies (ServerInfo, FlushCacheDone)--> TokenizerManager
    Scheduler --BatchEmbeddingOut (pooling models)--> TokenizerManager

Messages are pickled over ZMQ; keep them plain (ints, strs, lists, dicts),
except for the CPU tensors of a request's images (`MultimodalInputs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixlm.messages.mm_inputs import MultimodalInputs
from radixlm.messages.sampling_params import SamplingParams
from radixlm.utils import public_error_text

# (logprob, token_id)
LogprobEntry = tuple[float, int]

# A request with n > 1 runs as n samples "<rid>#<i>" (one scheduler request each).
SAMPLE_ID_SEPARATOR = "#"


def sample_rid(rid: str, index: int, num_samples: int) -> str:
    """The id of sample `index` of request `rid` (the rid itself when n == 1)."""
    return rid if num_samples == 1 else f"{rid}{SAMPLE_ID_SEPARATOR}{index}"


def is_sample_of(sample_id: str, rid: str) -> bool:
    """Whether `sample_id` is request `rid` or one of its samples."""
    return sample_id == rid or sample_id.startswith(rid + SAMPLE_ID_SEPARATOR)


@dataclass
class FinishReason:
    """Why a request ended. `type` is "stop", "length" or "abort"."""

    type: str
    matched: str | int | None = None  # the stop string, regex or token id, for "stop"
    matched_regex: bool = False  # `matched` is one of the request's stop_regex patterns
    message: str | None = None  # for "abort"
    status_code: int | None = None  # for an abort that should surface as an HTTP error

    def to_json(self) -> dict[str, Any]:
        """What a client sees (the message without source paths or addresses)."""
        out: dict[str, Any] = {"type": self.type, "matched": self.matched}
        if self.message is not None:
            out["message"] = public_error_text(self.message)
        return out


# ---------------------------------------------------------------- to the scheduler


@dataclass
class PoolingParams:
    """What a prefill-only request of a pooling model (embedding, classifier) asks for."""

    dimensions: int | None = None  # keep the first N values (Matryoshka), then normalize
    token_type_ids: list[int] | None = None  # segment ids of a pair (encoders)


@dataclass
class TokenizedGenerateReq:
    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int | None = None  # first prompt position with a logprob; None: none
    top_logprobs_num: int = 0
    stream: bool = False
    # Requests of one `n > 1` group share a prompt: the scheduler prefills the
    # first one and admits the others once its prompt is in the prefix cache.
    group_id: str | None = None
    seed: int | None = None  # resolved per sample (params.seed + index)
    # Images / videos: input_ids already hold each item's run of pad values.
    mm_inputs: MultimodalInputs | None = None
    # A pooling model's request (max_new_tokens 0): answered with an EmbeddingOut.
    pooling: PoolingParams | None = None
    # Batch API traffic: admitted after online requests, retracted before them.
    background: bool = False
    return_hidden_states: bool = False
    # With priority scheduling: larger is more urgent unless the server schedules low
    # values first (the scheduler applies the direction); 0 without it.
    priority: int = 0


@dataclass
class AbortReq:
    rid: str | None = None
    abort_all: bool = False
    message: str = "Aborted by request"


@dataclass
class FlushCacheReq:
    pass


@dataclass
class GetServerInfoReq:
    pass


@dataclass
class UpdateWeightsFromDiskReq:
    """Swap in the weights of another checkpoint of the same architecture and shapes."""

    model_path: str
    load_format: str | None = None


@dataclass
class ProfileReq:
    """Start or stop a torch.profiler trace of the scheduler process."""

    action: str  # "start" | "stop"
    output_dir: str | None = None
    num_steps: int | None = None
    activities: list[str] | None = None  # "CPU", "GPU"
    record_shapes: bool = False
    with_stack: bool = False
    profile_id: str | None = None


# ---------------------------------------------------------------- scheduler replies


@dataclass
class UpdateWeightsFromDiskOut:
    success: bool
    message: str
    num_paused_requests: int = 0


@dataclass
class ProfileOut:
    success: bool
    message: str
    trace_path: str | None = None


@dataclass
class FlushCacheOut:
    success: bool
    message: str = ""


@dataclass
class ServerInfoOut:
    info: dict[str, Any]


@dataclass
class SchedulerReady:
    """First message from the scheduler: the model is loaded."""

    model_info: dict[str, Any]


@dataclass
class ProcessError:
    """A child process failed; the TokenizerManager fails every request."""

    who: str
    message: str


@dataclass
class ReplicaLoad:
    """A data-parallel replica's scheduler to the DP controller, when its load changes."""

    dp_rank: int
    num_received: int  # requests it has received so far
    num_unfinished: int  # running + waiting


# ---------------------------------------------------------------- token / text outputs


@dataclass
class SpecCounts:
    """What speculative decoding did for one request so far."""

    verify_steps: int  # forward passes that verified a draft of it
    draft_tokens: int  # tokens drafted
    accepted_tokens: int  # drafted tokens that became output

    @property
    def accept_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0


@dataclass
class TokenOut:
    """New tokens of one request since the previous TokenOut for it."""

    rid: str
    new_token_ids: list[int]
    finished_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    forward_steps: int = 0  # forward passes the request took part in
    cached_tokens_disk: int = 0  # the part of cached_tokens read from the disk tier
    jump_forward_tokens: int = 0  # output tokens that jump-forward appended without sampling
    spec: SpecCounts | None = None  # set when the server decodes speculatively
    # Decoding config, repeated on every message so the detokenizer keeps no
    # config state of its own beyond the incremental decode offsets.
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    stop: list[str] = field(default_factory=list)
    stop_regex: list[str] = field(default_factory=list)
    no_stop_trim: bool = False
    # Logprob deltas (only when asked for).
    output_token_logprobs: list[LogprobEntry] | None = None
    output_top_logprobs: list[list[LogprobEntry]] | None = None
    input_token_logprobs: list[LogprobEntry | None] | None = None  # sent once
    input_top_logprobs: list[list[LogprobEntry] | None] | None = None
    # With return_hidden_states: the final hidden states of the positions computed since
    # the previous TokenOut (from position 0: the prompt's come first).
    hidden_states: list[list[float]] | None = None


@dataclass
class EmbeddingOut:
    """A pooling request's answer: its vector (or label logits), or why it failed."""

    rid: str
    embedding: list[float] | None
    finished_reason: FinishReason
    prompt_tokens: int
    cached_tokens: int


@dataclass
class BatchEmbeddingOut:
    """Scheduler → TokenizerManager directly (there is no text to detokenize)."""

    outs: list[EmbeddingOut]


@dataclass
class BatchTokenIDOut:
    outs: list[TokenOut]


@dataclass
class StrOut:
    """New text of one request since the previous StrOut for it."""

    rid: str
    text_delta: str
    token_out: TokenOut


@dataclass
class BatchStrOut:
    outs: list[StrOut]
