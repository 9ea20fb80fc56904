"""Token embedding and output head, laid out for a vocabulary split over ranks.

Rank r owns vocabulary rows `[r * per_partition, (r + 1) * per_partition)`
(the last partition padded). With `tp_size > 1` the embedding looks up its own
rows, zeroes the rest and all-reduces; the head gathers its logit columns on
rank 0, the rank that samples (the other ranks keep their own part, unused).
With `tp_size == 1` both are the plain operations.

`ParallelLMHead` can share its weight with the embedding (tied embeddings).
On the CPU it multiplies by a cached transposed copy of the weight
([hidden, vocab] contiguous): measured here, a batch-1 decode spends about
half as long in the output layer that way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.layers.linear import default_weight_loader
from radixlm.layers.prepared_weight import PreparedWeight, QuantWeight, prepare_weight
from radixlm.layers.quant.quant_tensor import QuantTensor


class VocabParallelEmbedding(nn.Module):
    """Embedding table [num_embeddings, embedding_dim] (Hugging Face name: weight)."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        params_dtype: torch.dtype | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.per_partition = -(-num_embeddings // tp_size)
        self.vocab_start = tp_rank * self.per_partition
        weight = torch.zeros(self.per_partition, embedding_dim, dtype=params_dtype)
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        # A GGUF block-quantized table (this rank's rows), looked up as it is.
        self.quant: QuantWeight | None = None

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        num_rows = min(self.per_partition, self.num_embeddings - self.vocab_start)
        src = loaded_weight.narrow(0, self.vocab_start, num_rows)
        if isinstance(src, QuantTensor):
            if tuple(src.shape) != (num_rows, self.embedding_dim):
                raise ValueError(f"{src.name}: shape {list(src.shape)}, expected "
                                 f"{[num_rows, self.embedding_dim]}")
            self.quant = QuantWeight.from_parts([src])
            # NOTE: the float table (shared with a tied head) is not needed any more.
            param.data = torch.empty(0, dtype=param.dtype, device=param.device)
            return
        default_weight_loader(param.narrow(0, 0, num_rows), src)

    def _lookup(self, ids: torch.Tensor) -> torch.Tensor:
        if self.quant is not None:
            return self.quant.embed(ids, self.weight.dtype)  # [T, embedding_dim]
        return F.embedding(ids, self.weight)  # [T, embedding_dim]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self._lookup(input_ids)  # [T, embedding_dim]
        local = input_ids - self.vocab_start  # [T]
        outside = (local < 0) | (local >= self.per_partition)  # [T]
        out = self._lookup(local.masked_fill(outside, 0))  # [T, embedding_dim]
        out.masked_fill_(outside[:, None], 0.0)
        torch.distributed.all_reduce(out)
        return out


class ParallelLMHead(VocabParallelEmbedding):
    """Output projection hidden → vocabulary logits; `tie_to()` shares the embedding's weight."""

    keeps_dense_weight = True  # a tied embedding looks rows up in it (prepared_weight.prepare_model)

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        params_dtype: torch.dtype | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        super().__init__(num_embeddings, embedding_dim, params_dtype, tp_rank, tp_size)
        self._weight_t: torch.Tensor | None = None  # [embedding_dim, per_partition], CPU only
        self._weight_t_key: tuple[int, int] | None = None
        # After prepare_weights(): the weight in its kernel's layout (prepared_weight.py).
        self.prepared: PreparedWeight | None = None
        # SmoothQuant scales [embedding_dim] for the int8 copy (set before prepare_weights).
        self.int8_smoothing: torch.Tensor | None = None
        self._tied_to: tuple[VocabParallelEmbedding, ...] = ()

    def tie_to(self, embedding: VocabParallelEmbedding) -> None:
        """Use the embedding table as this head's weight (one tensor for both)."""
        self.weight = embedding.weight
        self._tied_to = (embedding,)  # (a tuple: not registered as a submodule)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("ParallelLMHead is applied with compute_logits(), not called")

    def _transposed_weight(self) -> torch.Tensor:
        w = self.weight
        # NOTE: keyed on storage and version, so weights reloaded or moved rebuild the copy.
        key = (w.data_ptr(), 0 if w.is_inference() else w._version)
        if self._weight_t is None or self._weight_t_key != key:
            self._weight_t = w.detach().t().contiguous()  # [embedding_dim, per_partition]
            self._weight_t_key = key
        return self._weight_t

    def prepare_weights(self, quantization: str, keep_plain: bool = False) -> str:
        """Keep the (possibly tied) weight in its kernel's layout for compute_logits
        (prepared_weight.prepare_weight). Returns "int8", "packed", "quantized" or "dense".

        The dense weight stays: a tied embedding still looks rows up in it, and with
        keep_plain, compute_logits of 1-2 rows streams it (cpu_gemm.small_batch_linear).
        """
        quant = self._tied_to[0].quant if self._tied_to else self.quant
        if self.prepared is None and quant is not None:
            self.prepared = quant.as_logits()  # the GGUF table as it is, float32 logits
        if self.prepared is None:
            self.prepared = prepare_weight(self.weight, quantization, keep_plain,
                                           smoothing=self.int8_smoothing, lm_head=True)
            self._weight_t = None
        return self.prepared.category

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [M, embedding_dim] → float32 logits [M, num_embeddings] (with tp_size > 1:
        on rank 0; the other ranks get their own columns [M, per_partition])."""
        if self.prepared is not None:
            logits = self.prepared.apply(hidden, None)  # [M, rows held]
            if logits.shape[-1] < self.per_partition:  # a quantized last partition: its rows
                logits = F.pad(logits, (0, self.per_partition - logits.shape[-1]))
            # [M, per_partition]
        elif hidden.device.type == "cpu":
            logits = hidden @ self._transposed_weight()  # [M, per_partition]
        else:
            logits = F.linear(hidden, self.weight)  # [M, per_partition]
        if self.tp_size > 1:
            logits = logits.contiguous()
            if self.tp_rank != 0:
                torch.distributed.gather(logits, None, dst=0)
                return logits.float()  # [M, per_partition], this rank's part
            parts = [torch.empty_like(logits) for _ in range(self.tp_size)]
            torch.distributed.gather(logits, parts, dst=0)
            logits = torch.cat(parts, dim=-1)  # [M, tp_size * per_partition]
        return logits[:, : self.num_embeddings].float()
