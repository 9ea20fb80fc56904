"""The model runner: loads the model, owns the device memory, runs one step.

The scheduler hands it a `StepPlan` (CPU objects). `forward()` is the only
place that builds device tensors: it turns the plan into a `ForwardBatch`,
runs the model, computes logits only for the rows that need them (the last
token of each sampling request, plus prompt-logprob positions), samples, and
returns plain Python results.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

import torch

from radixlm.io_struct import LogprobEntry
from radixlm.layers.attention import AttentionBackend, create_attention_backend
from radixlm.layers.cpu_gemm import prepare_model
from radixlm.layers.cpu_kernels import load_cpu_kernels
from radixlm.mem_cache import create_prefix_cache
from radixlm.mem_cache.base_prefix_cache import BasePrefixCache
from radixlm.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixlm.model_executor.forward_batch import ForwardBatch
from radixlm.model_executor.precision import resolve_precision
from radixlm.model_loader.loader import load_model
from radixlm.multimodal.mm_inputs import MultimodalInputs
from radixlm.sampling.sampler import SamplingBatchInfo, compute_logprobs, sample_checked
from radixlm.sampling.sampling_params import SamplingParams
from radixlm.scheduler.request import ForwardResult, InputLogprobs, Req, StepPlan
from radixlm.server_args import ServerArgs

logger = logging.getLogger(__name__)

def _usable_cores() -> int:
    """Cores this process may run on (its affinity mask: taskset, cgroups), not all of them."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _available_memory_bytes(device: str) -> int:
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        return int(free)
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 8 << 30


class ModelRunner:
    def __init__(self, args: ServerArgs, model_dir: str) -> None:
        self.args = args
        self.device = args.device
        if args.device == "cpu":
            torch.set_num_threads(args.num_threads or _usable_cores())
            logger.info("CPU threads: %d (OMP_WAIT_POLICY=%s)", torch.get_num_threads(),
                        os.environ.get("OMP_WAIT_POLICY", "default"))
        self.precision = resolve_precision(args.dtype, args.quantization, args.device)
        self.dtype = self.precision.dtype
        logger.info("Precision: %s", self.precision.describe())
        self.model, self.config = load_model(model_dir, self.dtype, self.device)
        quantization = self.precision.quantization
        if quantization != "none" or (self.device == "cpu" and not args.disable_cpu_prepack):
            num_int8, num_packed = prepare_model(self.model, quantization)
            logger.info("Weights: %d int8, %d oneDNN-packed", num_int8, num_packed)
        text_config = getattr(self.config, "text_config", None) or self.config
        self.vocab_size = int(text_config.vocab_size)
        self.context_len = int(args.context_length or text_config.max_position_embeddings)
        self.eos_token_ids = _eos_ids(self.config, model_dir)
        self._init_memory(text_config)
        self.attn_backend = self._create_attention_backend(args.attention_backend)
        self.grammar_mask_seconds = 0.0  # filling + applying grammar masks, all steps
        self.num_grammar_mask_steps = 0

    def _create_attention_backend(self, name: str) -> AttentionBackend:
        if name == "auto":
            on_cpu = self.device == "cpu" and load_cpu_kernels() is not None
            name = "cpu_paged" if on_cpu else "torch_native"
        logger.info("Attention backend: %s", name)
        return create_attention_backend(name, self.model)

    def _init_memory(self, cfg) -> None:  # type: ignore[no-untyped-def]
        num_layers = int(cfg.num_hidden_layers)
        num_kv_heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        num_tokens = self.args.max_total_tokens
        if num_tokens is None:
            per_token = TokenToKVPool.bytes_per_token(num_layers, num_kv_heads, head_dim, self.dtype)
            budget = int(_available_memory_bytes(self.device) * self.args.mem_fraction)
            num_tokens = min(budget // per_token, self.args.max_running_requests * self.context_len)
        num_tokens = max(int(num_tokens), 2)
        self.token_to_kv_pool = TokenToKVPool(
            num_tokens, num_layers, num_kv_heads, head_dim, self.dtype, self.device
        )
        # A few extra rows: requests retracted mid-step release theirs before the next admit.
        self.req_to_token_pool = ReqToTokenPool(
            self.args.max_running_requests + 1, self.context_len + 8, self.device
        )
        self.prefix_cache: BasePrefixCache = create_prefix_cache(
            self.token_to_kv_pool, self.args.disable_radix_cache
        )
        logger.info("KV pool: %d tokens (%d layers, %d kv heads, head dim %d)",
                    num_tokens, num_layers, num_kv_heads, head_dim)

    # ------------------------------------------------------------------ step

    @torch.inference_mode()
    def forward(self, plan: StepPlan) -> ForwardResult:
        batch, sample_rows, logprob_rows = self._build_batch(plan)
        self.attn_backend.init_forward_metadata(batch)
        hidden = self.model(batch.input_ids, batch.positions, batch)  # [T, hidden]
        assert batch.logits_indices is not None
        logits = self.model.compute_logits(hidden[batch.logits_indices])  # [M, V]
        return self._sample(plan, logits, sample_rows, logprob_rows)

    def _build_batch(self, plan: StepPlan) -> tuple[ForwardBatch, list[int], list[tuple[int, int]]]:
        input_ids: list[int] = []
        positions: list[int] = []
        logits_indices: list[int] = []
        sample_rows: list[int] = []  # per item: row in logits, or -1
        logprob_rows: list[tuple[int, int]] = []  # per item: [start, end) rows in logits
        offset = 0
        for item in plan.items:
            input_ids.extend(item.input_ids)
            positions.extend(range(item.prefix_len, item.prefix_len + item.extend_len))
            start = len(logits_indices)
            if item.logprob_positions is not None:
                lo, hi = item.logprob_positions
                logits_indices.extend(offset + p - item.prefix_len for p in range(lo, hi))
            logprob_rows.append((start, len(logits_indices)))
            if item.samples:
                sample_rows.append(len(logits_indices))
                logits_indices.append(offset + item.extend_len - 1)
            else:
                sample_rows.append(-1)
            offset += item.extend_len
        dev = self.device
        batch = ForwardBatch(
            input_ids=torch.tensor(input_ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            out_cache_loc=plan.out_cache_loc.to(dev),
            req_pool_indices=torch.tensor(
                [it.req.req_pool_idx for it in plan.items], dtype=torch.int64, device=dev
            ),
            req_to_token=self.req_to_token_pool.req_to_token,
            token_to_kv_pool=self.token_to_kv_pool,
            prefix_lens=[it.prefix_len for it in plan.items],
            extend_lens=[it.extend_len for it in plan.items],
            logits_indices=torch.tensor(logits_indices, dtype=torch.int64, device=dev),
            attn_backend=self.attn_backend,
            mm_inputs=_mm_inputs(plan),
        )
        return batch, sample_rows, logprob_rows

    def _sample(
        self,
        plan: StepPlan,
        logits: torch.Tensor,
        sample_rows: list[int],
        logprob_rows: list[tuple[int, int]],
    ) -> ForwardResult:
        n = len(plan.items)
        next_ids: list[int | None] = [None] * n
        token_lps: list[LogprobEntry | None] = [None] * n
        top_lps: list[list[LogprobEntry] | None] = [None] * n
        input_lps: list[InputLogprobs | None] = [None] * n

        sampling = [i for i in range(n) if sample_rows[i] >= 0]
        if sampling:
            reqs = [plan.items[i].req for i in sampling]
            rows = [sample_rows[i] for i in sampling]
            want_lp = [j for j, r in enumerate(reqs) if r.return_logprob]
            if rows == list(range(logits.shape[0])):
                raw = logits  # [S, V]: every row samples, in order (no prompt logprobs)
            else:
                raw = logits[torch.tensor(rows, device=logits.device)]  # [S, V], a copy
            if any(r.grammar is not None for r in reqs):
                start = time.perf_counter()
                _apply_grammar_masks(raw, reqs, self.vocab_size)
                self.grammar_mask_seconds += time.perf_counter() - start
                self.num_grammar_mask_steps += 1
            info = SamplingBatchInfo.from_params(
                [_effective_params(r) for r in reqs],
                [r.output_ids for r in reqs],
                [r.generator for r in reqs],
                self.vocab_size,
                self.eos_token_ids,
                device=self.device,
            )
            # NOTE: sampling edits its input in place; logprobs need the unedited logits.
            chosen, valid = sample_checked(raw.clone() if want_lp else raw, info)  # [S], [S]
            chosen_list = chosen.tolist()
            valid_list = valid.tolist()
            if want_lp:
                idx = torch.tensor(want_lp, device=logits.device)
                lp = compute_logprobs(
                    raw[idx], chosen[idx], [reqs[j].top_logprobs_num for j in want_lp]
                )
                for k, j in enumerate(want_lp):
                    token_lps[sampling[j]] = lp.token_logprobs[k]
                    top_lps[sampling[j]] = lp.top_logprobs[k]
            for j, i in enumerate(sampling):
                # A row without a valid distribution (NaN logits) samples no token.
                next_ids[i] = chosen_list[j] if valid_list[j] else None

        for i, item in enumerate(plan.items):
            if item.logprob_positions is None:
                continue
            start, end = logprob_rows[i]
            lo, hi = item.logprob_positions
            targets = item.req.origin_input_ids[lo + 1 : hi + 1]
            # NOTE: an image's pad ids are >= vocab_size: scored as token 0, reported as None.
            lp = compute_logprobs(
                logits[start:end],
                torch.tensor([t if t < self.vocab_size else 0 for t in targets],
                             dtype=torch.int64, device=logits.device),
                [item.req.top_logprobs_num] * len(targets),
            )
            token_lps_in: list[LogprobEntry | None] = [
                e if t < self.vocab_size else None for e, t in zip(lp.token_logprobs, targets)]
            input_lps[i] = (token_lps_in, list(lp.top_logprobs))
        return ForwardResult(next_ids, token_lps, top_lps, input_lps)


def _mm_inputs(plan: StepPlan) -> list[MultimodalInputs | None] | None:
    """Each item's images / videos, or None when the step has none (the text path)."""
    mm = [item.req.mm_inputs for item in plan.items]
    return mm if any(m is not None for m in mm) else None


def _effective_params(req: Req) -> SamplingParams:
    """The request's sampling params, except that a grammar decides where the output may
    end: min_new_tokens must not ban EOS where the grammar allows nothing else."""
    params = req.sampling_params
    if req.grammar is not None and params.min_new_tokens > 0:
        return dataclasses.replace(params, min_new_tokens=0)
    return params


def _apply_grammar_masks(logits: torch.Tensor, reqs: list[Req], vocab_size: int) -> None:
    """Constrained rows of logits [S, V] get -inf where their grammar forbids the token.

    One bitmask for the batch: each grammar fills its row, one call applies them all.
    Logprobs are then taken from the masked logits: the distribution actually sampled.
    """
    rows = [j for j, req in enumerate(reqs) if req.grammar is not None]
    from radixlm.constrained.base_grammar_backend import allocate_vocab_mask, apply_vocab_mask

    mask = allocate_vocab_mask(len(reqs), vocab_size)  # [S, ceil(V/32)] int32
    for j in rows:
        reqs[j].grammar.fill_vocab_mask(mask, j)  # type: ignore[union-attr]
    apply_vocab_mask(logits, mask, rows)


def _eos_ids(config, model_dir: str) -> set[int]:  # type: ignore[no-untyped-def]
    ids: set[int] = set()
    for source in (config, _generation_config(model_dir)):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list | tuple):
            ids.update(int(e) for e in eos)
    return ids


def _generation_config(model_dir: str):  # type: ignore[no-untyped-def]
    try:
        from transformers import GenerationConfig

        return GenerationConfig.from_pretrained(model_dir)
    except Exception:  # noqa: BLE001 - optional file
        return None
