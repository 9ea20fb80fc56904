"""Drive a radixlm model through real KV pools the way the model runner does.

Tiny random-weight Hugging Face models are built from configs here, saved with
`save_pretrained`, loaded with radixlm's loader, and compared with the
transformers implementation on the full sequences.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from radixlm.layers.attention import create_attention_backend
from radixlm.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixlm.model_executor.forward_batch import ForwardBatch

if TYPE_CHECKING:
    from radixlm.messages.mm_inputs import MultimodalInputs

TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    initializer_range=0.1,
)


def build_hf_model(model_type: str, seed: int = 0, **overrides: Any) -> nn.Module:
    """A random transformers model of this type, with non-trivial norms and biases."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **{**TINY, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return perturb_weights(model)


def build_and_load(model_type: str, overrides: dict[str, Any], path: Path) -> tuple[nn.Module, nn.Module, Any]:
    """build_hf_model's model, saved to `path` and loaded by radixlm in float32:
    (transformers' model, radixlm's, radixlm's config)."""
    from radixlm.model_loader.loader import load_model

    hf: Any = build_hf_model(model_type, **overrides)  # a transformers PreTrainedModel
    hf.save_pretrained(path)
    ours, config = load_model(str(path), torch.float32, "cpu")
    return hf, ours, config


@torch.no_grad()
def perturb_weights(model: nn.Module, extra: tuple[str, ...] = ()) -> nn.Module:
    """Non-trivial biases and norms (zeros and ones would hide bugs); parameters whose
    name contains one of `extra` get N(0, 0.3). Returns the model in eval mode."""
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            p.normal_(0.0, 0.1)
        elif "norm" in name:
            p.copy_(1.0 + 0.2 * torch.randn_like(p))
        elif any(part in name for part in extra):
            p.normal_(0.0, 0.3)
    return model.eval()


@torch.no_grad()
def hf_logits(model: nn.Module, ids: list[int]) -> torch.Tensor:
    """transformers' logits for one full sequence: [len(ids), vocab]."""
    return model(input_ids=torch.tensor([ids])).logits[0].float()


class PoolRunner:
    """Requests hold a row of the slot table; each step extends some of them by a few tokens."""

    def __init__(
        self,
        model: nn.Module,
        config: Any,
        num_slots: int = 1024,
        max_requests: int = 8,
        max_context: int = 256,
        dtype: torch.dtype = torch.float32,
        backend: str = "torch_native",
        kv_cache_dtype: str = "auto",
    ) -> None:
        head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        self.model = model
        self.kv = TokenToKVPool(
            num_slots,
            config.num_hidden_layers,
            config.num_key_value_heads,
            head_dim,
            dtype,
            "cpu",
            kv_cache_dtype=kv_cache_dtype,
        )
        self.rows = ReqToTokenPool(max_requests, max_context, "cpu")
        self.backend = create_attention_backend(backend, model)
        self.cached: dict[int, int] = {}  # request row → tokens whose KV is in the pool

    def new_request(self, share_prefix_of: int | None = None, prefix_len: int = 0) -> int:
        """A new request row; optionally starting with another request's first prefix_len slots."""
        row = self.rows.alloc()
        assert row is not None
        self.cached[row] = 0
        if share_prefix_of is not None:
            table = self.rows.req_to_token
            table[row, :prefix_len] = table[share_prefix_of, :prefix_len]
            self.cached[row] = prefix_len
        return row

    @torch.no_grad()
    def step(
        self,
        items: list[tuple[int, list[int]]],
        mm_inputs: list[MultimodalInputs | None] | None = None,
        last_only: bool = False,
    ) -> list[torch.Tensor]:
        """One forward over (request row, new token ids) items → per item logits [n, vocab]
        ([1, vocab], the last token's, with last_only).

        mm_inputs: per item, that request's images (whole prompt), as the runner passes them.
        """
        input_ids: list[int] = []
        positions: list[int] = []
        locs = []
        for row, ids in items:
            start = self.cached[row]
            slots = self.kv.alloc(len(ids))
            assert slots is not None
            self.rows.req_to_token[row, start : start + len(ids)] = slots
            locs.append(slots)
            input_ids += ids
            positions += range(start, start + len(ids))
        batch = ForwardBatch(
            input_ids=torch.tensor(input_ids),
            positions=torch.tensor(positions),
            out_cache_loc=torch.cat(locs),
            req_pool_indices=torch.tensor([row for row, _ in items]),
            req_to_token=self.rows.req_to_token,
            token_to_kv_pool=self.kv,
            prefix_lens=[self.cached[row] for row, _ in items],
            extend_lens=[len(ids) for _, ids in items],
            attn_backend=self.backend,
            mm_inputs=mm_inputs,
        )
        self.backend.init_forward_metadata(batch)
        hidden = self.model(batch.input_ids, batch.positions, batch)  # [T, hidden]
        for row, ids in items:
            self.cached[row] += len(ids)
        if last_only:
            last = torch.tensor(batch.extend_lens).cumsum(0) - 1  # [B]
            return list(self.model.compute_logits(hidden[last]).split(1))
        logits = self.model.compute_logits(hidden)  # [T, vocab]
        return list(logits.split(batch.extend_lens))
