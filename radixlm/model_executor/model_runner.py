"""The model runner: loads the model, owns the device memory, runs one step.

The scheduler hands it a `ForwardStep` (plain CPU values, see
messages/forward_step.py) and gets a `StepResult` back. `forward()` is the only place
that builds device tensors: it turns the step into a `ForwardBatch`, runs the
model, computes logits only for the rows that need them (each item's sampled
rows, plus prompt-logprob positions), applies the step's grammar masks,
samples, and returns plain Python results. It keeps one piece of state per
request between steps: a seeded request's RNG, under its rid.

Tensor parallelism (`--tp-size N`): every rank builds a runner on its shard of
the model and its own KV pool for its heads. Rank 0's `forward()` first
broadcasts the step (distributed/step_sync.py); the other ranks run
`forward_shard()` on it, which computes the same layers (their all-reduces and
the logits gather meet rank 0's) and samples nothing.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, NamedTuple

import torch

from radixlm.distributed.parallel_state import (
    TPConfig,
    init_tp_group,
    kv_heads_per_rank,
    tp_rank_size,
)
from radixlm.distributed.step_sync import StepBroadcaster
from radixlm.layers.attention import AttentionBackend, create_attention_backend
from radixlm.layers.cpu_kernels import load_cpu_kernels
from radixlm.layers.prepared_weight import prepare_model
from radixlm.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixlm.messages.forward_step import (
    ForwardStep,
    PromptLogprobs,
    SamplingSpec,
    StepResult,
    VocabMask,
)
from radixlm.messages.io_struct import LogprobEntry
from radixlm.messages.mm_inputs import MultimodalInputs
from radixlm.model_executor.calibration import smooth_for_int8
from radixlm.model_executor.cpu_threads import ThreadGovernor, spins, usable_cpus
from radixlm.model_executor.forward_batch import ForwardBatch
from radixlm.model_executor.precision import resolve_precision
from radixlm.model_loader.gguf_convert import gguf_is_quantized
from radixlm.model_loader.loader import CheckpointShapes, load_model
from radixlm.models.base import CausalLM, PoolingModel
from radixlm.models.layer_stack import fast_path_report
from radixlm.models.pooler import finish_vector
from radixlm.models.registry import get_model_class
from radixlm.sampling.sampler import SamplingBatchInfo, compute_logprobs, sample_checked
from radixlm.server_args import ServerArgs

logger = logging.getLogger(__name__)

def _min_over_ranks(value: int) -> int:
    """The smallest `value` over the TP group (every rank must size its pool alike)."""
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def _available_memory_bytes(device: str) -> int:
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info()
        return int(free)
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 8 << 30


class ModelRunner:
    thread_governor: ThreadGovernor | None = None

    def __init__(self, args: ServerArgs, model_dir: str, tp: TPConfig | None = None) -> None:
        """tp: this rank's place in its tensor-parallel group; None: one process, no group."""
        self.args = args
        self.device = args.device
        num_local_ranks = tp.num_local_ranks if tp is not None else 1
        if args.device == "cpu":
            # NOTE: the ranks of a node share its cores: each takes its share, or they
            # oversubscribe them and every collective waits for a descheduled thread.
            torch.set_num_threads(args.num_threads or max(len(usable_cpus()) // num_local_ranks, 1))
            self.thread_governor = self._thread_governor(num_local_ranks * args.dp_size)
        elif tp is not None:
            torch.cuda.set_device(tp.local_rank)
            self.device = f"cuda:{tp.local_rank}"
        if tp is not None and tp.size > 1 and not torch.distributed.is_initialized():
            init_tp_group(tp)
        self.tp_rank, self.tp_size = tp_rank_size()
        self.precision = resolve_precision(args.dtype, args.quantization, args.device,
                                           gguf=gguf_is_quantized(model_dir))
        self.dtype = self.precision.dtype
        logger.info("Precision: %s", self.precision.describe())
        self.model_path = model_dir
        self.checkpoint_shapes = CheckpointShapes()
        self.model, self.config = self._load(model_dir, self.checkpoint_shapes)
        text_config = getattr(self.config, "text_config", None) or self.config
        self.vocab_size = int(text_config.vocab_size)
        self.context_len = int(args.context_length or text_config.max_position_embeddings)
        self.model.set_context_length(self.context_len)
        self.eos_token_ids = _eos_ids(self.config, model_dir)
        self._init_memory(text_config)
        self.attn_backend = self._create_attention_backend(args.attention_backend)
        self.grammar_mask_seconds = 0.0  # filling + applying grammar masks, all steps
        self.num_grammar_mask_steps = 0
        self._generators: dict[str, torch.Generator] = {}  # seeded requests' RNGs, by rid
        # Rank 0 of a TP group: sends each step to the other ranks.
        self.step_broadcaster: StepBroadcaster | None = None
        if self.tp_size > 1 and self.tp_rank == 0:
            assert tp is not None
            self.step_broadcaster = StepBroadcaster(self.req_to_token_pool.req_to_token,
                                                    tp.timeout)

    def _create_attention_backend(self, name: str) -> AttentionBackend:
        if name == "auto":
            on_cpu = self.device == "cpu" and load_cpu_kernels() is not None
            name = "cpu_paged" if on_cpu else "torch_native"
        logger.info("Attention backend: %s", name)
        return create_attention_backend(name, self.model)

    def _load(self, model_dir: str, shapes: CheckpointShapes) -> tuple[CausalLM, Any]:
        """The model as served (loaded, then quantized or packed for the CPU), and its
        config: the same at start-up and for a weight update."""
        model, config = load_model(model_dir, self.dtype, self.device,
                                   is_embedding=self.args.is_embedding, shapes=shapes,
                                   shard_only=self.tp_size > 1,
                                   keep_quantized=self.precision.quantization == "gguf")
        quantization = self.precision.quantization
        if quantization == "w8a8_int8" and self.tp_size == 1 and self.device == "cpu":
            # NOTE: a TP rank would calibrate on its shard alone, and its forward would run
            # collectives at load; TP and CUDA int8 are quantized without smoothing.
            smooth_for_int8(model, config, model_dir)
        if quantization != "none" or (self.device == "cpu" and not self.args.disable_cpu_prepack):
            num_int8, num_packed = prepare_model(model, quantization)
            logger.info("Weights: %d quantized (int8 or GGUF block formats), %d packed (oneDNN "
                        "or bf16 pairs)", num_int8, num_packed)
        if self.device == "cpu" and (report := fast_path_report(model)) is not None:
            logger.info("Layers: %s", report)
        return model, config

    @property
    def is_generation(self) -> bool:
        return self.model.is_generation

    @property
    def needs_whole_prompt(self) -> bool:
        """Prompts are computed in one step from position 0 (see PoolingModel)."""
        return isinstance(self.model, PoolingModel) and self.model.needs_whole_prompt

    def _init_memory(self, cfg: Any) -> None:
        # NOTE: an encoder writes no KV (transformers' attention runs on its own), so its
        # pool holds slots for the scheduler's accounting and no layers.
        uses_kv = not isinstance(self.model, PoolingModel) or self.model.is_causal
        num_layers = int(cfg.num_hidden_layers) if uses_kv else 0
        num_kv_heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        num_kv_heads = kv_heads_per_rank(num_kv_heads, self.tp_size)  # this rank's heads
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        kv_cache_dtype = self.args.kv_cache_dtype
        # The real bytes of a slot in the pool's format (an int8 row's scale included).
        per_token = max(TokenToKVPool.bytes_per_token(num_layers, num_kv_heads, head_dim,
                                                      self.dtype, kv_cache_dtype), 1)
        num_tokens = self.args.max_total_tokens
        if num_tokens is None:
            budget = int(_available_memory_bytes(self.device) * self.args.mem_fraction)
            num_tokens = min(budget // per_token, self.args.max_running_requests * self.context_len)
        num_tokens = max(int(num_tokens), 2)
        if self.tp_size > 1:
            num_tokens = _min_over_ranks(num_tokens)  # rank 0 allocates slots for every rank
        self.token_to_kv_pool = TokenToKVPool(
            num_tokens, num_layers, num_kv_heads, head_dim, self.dtype, self.device,
            kv_cache_dtype=kv_cache_dtype,
        )
        # A few extra rows: requests retracted mid-step release theirs before the next admit.
        self.req_to_token_pool = ReqToTokenPool(
            self.args.max_running_requests + 1, self.context_len + 8, self.device
        )
        pool = self.token_to_kv_pool
        logger.info("KV pool: %d tokens in %s (%d bytes a token, %.1f MiB; %d layers, "
                    "%d kv heads, head dim %d)%s", num_tokens, pool.kv_cache_dtype, per_token,
                    num_tokens * per_token / 2**20, num_layers, num_kv_heads, head_dim,
                    "" if not pool.kv_format.quantized else
                    f": {pool.tokens_vs_auto():.2f}x the tokens of {pool.dtype} in the same memory")
        if kv_cache_dtype.startswith("fp8"):
            logger.warning("--kv-cache-dtype %s stores K/V unscaled in 8 bits, below the "
                           "accuracy gate on small models; int8 takes as little memory and "
                           "passes it (docs/kv-cache.md#kv-cache-dtypes)", kv_cache_dtype)

    # ------------------------------------------------------------------ step

    @torch.inference_mode()
    def forward(self, step: ForwardStep) -> StepResult:
        """Run one forward pass and sample its sampled rows (see messages/forward_step.py)."""
        for rid in step.released_rids:
            self._generators.pop(rid, None)
        if isinstance(self.model, PoolingModel):  # (never tensor-parallel: launch.py refuses)
            batch, _ = self._build_batch(step)
            self.attn_backend.init_forward_metadata(batch)
            return self._pool(step, batch)
        if self.step_broadcaster is not None:
            self.step_broadcaster.send_step(step)
        hidden, logits, layout = self._forward_logits(step)  # [T, hidden], [M, V]
        next_ids, token_lps, top_lps = self._sample(step, logits, layout.sample_rows)
        return StepResult(next_ids, token_lps, top_lps,
                          self._prompt_logprobs(step, logits, layout.prompt_rows),
                          hidden_states=_hidden_states(step, hidden))

    @torch.inference_mode()
    def forward_shard(self, step: ForwardStep) -> None:
        """A TP rank other than 0: compute this rank's shard of the step (rank 0 samples)."""
        self._forward_logits(step)

    def _forward_logits(self, step: ForwardStep
                        ) -> tuple[torch.Tensor, torch.Tensor, _LogitsLayout]:
        """The final hidden states [T, hidden] of the step's tokens, the logits [M, V] of
        its logit rows (on ranks other than 0 of a TP group, this rank's vocabulary part,
        unused), and where each row sits."""
        batch, layout = self._build_batch(step)
        self.attn_backend.init_forward_metadata(batch)
        hidden = self.model(batch.input_ids, batch.positions, batch)  # [T, hidden]
        assert batch.logits_indices is not None
        return hidden, self.model.compute_logits(hidden[batch.logits_indices]), layout

    def _thread_governor(self, num_processes: int) -> ThreadGovernor | None:
        """--thread-policy adaptive with one scheduler process and more than one thread."""
        threads, policy = torch.get_num_threads(), self.args.thread_policy
        adaptive = policy == "adaptive" and spins(policy, num_processes) and threads > 1
        logger.info("CPU threads: %d, %s (OMP_WAIT_POLICY=%s)", threads,
                    "adaptive: spin, one thread while other processes keep the cores busy"
                    if adaptive else policy, os.environ.get("OMP_WAIT_POLICY", "default"))
        return ThreadGovernor(threads, torch.set_num_threads) if adaptive else None

    def tune_threads(self) -> None:
        """Called every scheduler iteration: the adaptive thread policy's sample."""
        if self.thread_governor is not None:
            self.thread_governor.tick()

    def keep_alive(self) -> None:
        """Rank 0 of a TP group: a heartbeat to the other ranks when it has been idle."""
        if self.step_broadcaster is not None:
            self.step_broadcaster.keep_alive()

    def stop_workers(self) -> None:
        """Rank 0 of a TP group: tell the other ranks to exit (best effort: on one node the
        launcher may have stopped them already)."""
        if self.step_broadcaster is not None:
            try:
                self.step_broadcaster.stop()
            except RuntimeError as e:  # a rank already gone: nothing left to stop
                logger.info("TP ranks already stopped (%s)", str(e).split(". ")[0])
            self.step_broadcaster = None

    def _build_batch(self, step: ForwardStep) -> tuple[ForwardBatch, _LogitsLayout]:
        input_ids: list[int] = []
        positions: list[int] = []
        logits_indices: list[int] = []  # rows of the flattened tokens that get logits
        layout = _LogitsLayout([], [])
        offset = 0
        for item in step.items:
            input_ids.extend(item.input_ids)
            positions.extend(item.positions)
            spec = item.prompt_logprobs
            if spec is None:
                layout.prompt_rows.append(None)
            else:
                first = offset + spec.start - item.prefix_len
                num = len(spec.target_ids)
                layout.prompt_rows.append((len(logits_indices), len(logits_indices) + num))
                logits_indices.extend(range(first, first + num))
            end = offset + item.extend_len
            for row in range(end - item.num_sample_rows, end):
                layout.sample_rows.append(len(logits_indices))
                logits_indices.append(row)
            offset = end
        dev = self.device
        mm = [item.mm_inputs for item in step.items]
        batch = ForwardBatch(
            input_ids=torch.tensor(input_ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            out_cache_loc=step.out_cache_loc.to(dev),
            req_pool_indices=torch.tensor(
                [item.req_pool_idx for item in step.items], dtype=torch.int64, device=dev
            ),
            req_to_token=self.req_to_token_pool.req_to_token,
            token_to_kv_pool=self.token_to_kv_pool,
            prefix_lens=[item.prefix_len for item in step.items],
            extend_lens=[item.extend_len for item in step.items],
            logits_indices=torch.tensor(logits_indices, dtype=torch.int64, device=dev),
            attn_backend=self.attn_backend,
            mm_inputs=_mm_inputs(mm),
        )
        return batch, layout

    def _pool(self, step: ForwardStep, batch: ForwardBatch) -> StepResult:
        """A pooling model's step: each item that completes its prompt gets its vector."""
        model = self.model
        assert isinstance(model, PoolingModel)
        batch.token_type_ids = [
            it.pooling.token_type_ids if it.pooling is not None else None for it in step.items]
        vectors = model.pool_forward(batch.input_ids, batch.positions, batch)  # [B, D]
        normalize = model.num_labels == 0 and model.pooling.normalize
        embeddings: list[list[float] | None] = [None] * len(step.items)
        for i, item in enumerate(step.items):
            if item.num_sample_rows:
                dims = item.pooling.dimensions if item.pooling is not None else None
                embeddings[i] = finish_vector(vectors[i], dims, normalize)
        num_rows = step.num_sample_rows
        return StepResult([None] * num_rows, [None] * num_rows, [None] * num_rows,
                          [None] * len(step.items), embeddings)

    # ------------------------------------------------------------------ weights

    def update_weights_from_disk(self, model_path: str, load_format: str | None
                                 ) -> tuple[bool, str]:
        """Swap in another checkpoint of the same architecture and shapes; on any
        problem keep the served weights and say why. The caller flushes the prefix
        cache (its KV came from the old weights)."""
        from transformers import AutoConfig

        from radixlm.model_executor.weight_update import check_replacement, read_shapes
        from radixlm.model_loader.model_path import resolve_model_dir

        try:
            model_dir = resolve_model_dir(model_path)
            config = AutoConfig.from_pretrained(model_dir)
            new_cls = get_model_class(config, self.args.is_embedding)
            shapes = read_shapes(model_dir, load_format)
        except (OSError, ValueError) as e:
            return False, f"Cannot use the checkpoint at {model_path!r}: {e}"
        problem = check_replacement(type(self.model), self.checkpoint_shapes, new_cls, shapes)
        if problem is not None:
            return False, problem
        start = time.perf_counter()
        try:
            model, config = self._load(model_dir, CheckpointShapes())
        except (OSError, ValueError) as e:
            return False, f"Loading {model_path!r} failed, the served weights are kept: {e}"
        self.model, self.config = model, config
        self.attn_backend = self._create_attention_backend(self.args.attention_backend)
        self.checkpoint_shapes = shapes
        self.model_path = model_dir
        logger.info("Loaded new weights from %s in %.2f s", model_dir,
                    time.perf_counter() - start)
        return True, "Succeeded to update model weights."

    def _sample(
        self, step: ForwardStep, logits: torch.Tensor, sample_rows: list[int]
    ) -> tuple[list[int | None], list[LogprobEntry | None], list[list[LogprobEntry] | None]]:
        """Next token per sampled row (and its logprobs where asked), from logits [M, V].

        A row without a valid distribution (a NaN or infinite logit, every token masked)
        samples no token: None, and the scheduler fails that request alone.
        """
        rids: list[str] = []
        specs: list[SamplingSpec] = []
        for item in step.items:
            if item.num_sample_rows:
                assert item.sampling is not None, "a sampled item needs its SamplingSpec"
                rids.extend([item.rid] * item.num_sample_rows)
                specs.extend([item.sampling] * item.num_sample_rows)
        num_rows = len(specs)
        token_lps: list[LogprobEntry | None] = [None] * num_rows
        top_lps: list[list[LogprobEntry] | None] = [None] * num_rows
        if not num_rows:
            return [], token_lps, top_lps
        if sample_rows == list(range(logits.shape[0])):
            raw = logits  # [S, V]: every row samples, in order (no prompt logprobs)
        else:
            raw = logits[torch.tensor(sample_rows, device=logits.device)]  # [S, V], a copy
        if step.vocab_mask is not None:
            start = time.perf_counter()
            _apply_vocab_mask(raw, step.vocab_mask)
            self.grammar_mask_seconds += time.perf_counter() - start
            self.num_grammar_mask_steps += 1
        info = SamplingBatchInfo.from_params(
            [s.params for s in specs],
            [s.output_ids for s in specs],
            [self._generator(rid, s.seed) for rid, s in zip(rids, specs)],
            self.vocab_size,
            self.eos_token_ids,
            device=self.device,
            num_output_tokens=[s.num_output_tokens for s in specs],
        )
        want_lp = [j for j, s in enumerate(specs) if s.return_logprob]
        # NOTE: sampling edits its input in place; logprobs need the unedited logits.
        checked = sample_checked(raw.clone() if want_lp else raw, info)
        chosen = checked.next_ids  # [S]
        if want_lp:
            idx = torch.tensor(want_lp, device=logits.device)
            lp = compute_logprobs(raw[idx], chosen[idx], [specs[j].top_logprobs_num for j in want_lp])
            for k, j in enumerate(want_lp):
                token_lps[j] = lp.token_logprobs[k]
                top_lps[j] = lp.top_logprobs[k]
        next_ids: list[int | None] = [
            t if ok else None for t, ok in zip(chosen.tolist(), checked.valid.tolist())]
        return next_ids, token_lps, top_lps

    def _generator(self, rid: str, seed: int | None) -> torch.Generator | None:
        """A seeded request's own RNG, created at its first sampled row."""
        if seed is None:
            return None
        generator = self._generators.get(rid)
        if generator is None:
            generator = self._generators[rid] = torch.Generator().manual_seed(seed)
        return generator

    def _prompt_logprobs(
        self, step: ForwardStep, logits: torch.Tensor, prompt_rows: list[tuple[int, int] | None]
    ) -> list[PromptLogprobs | None]:
        out: list[PromptLogprobs | None] = []
        for item, rows in zip(step.items, prompt_rows):
            spec = item.prompt_logprobs
            if spec is None or rows is None:
                out.append(None)
                continue
            targets = spec.target_ids
            # NOTE: an image's pad ids are >= vocab_size: scored as token 0, reported as None.
            lp = compute_logprobs(
                logits[rows[0] : rows[1]],
                torch.tensor([t if t < self.vocab_size else 0 for t in targets],
                             dtype=torch.int64, device=logits.device),
                [spec.top_logprobs_num] * len(targets),
            )
            token_lps: list[LogprobEntry | None] = [
                e if t < self.vocab_size else None for e, t in zip(lp.token_logprobs, targets)]
            out.append(PromptLogprobs(token_lps, list(lp.top_logprobs)))
        return out


class _LogitsLayout(NamedTuple):
    """Where a step's rows sit in its logits [M, V]."""

    sample_rows: list[int]  # logits row of each sampled row, in step order
    prompt_rows: list[tuple[int, int] | None]  # per item: [start, end) of its prompt logprobs


def _hidden_states(step: ForwardStep, hidden: torch.Tensor
                   ) -> list[list[list[float]] | None] | None:
    """The rows of hidden [T, hidden] of each item that asked for them, as float lists."""
    if not any(item.return_hidden_states for item in step.items):
        return None
    out: list[list[list[float]] | None] = []
    offset = 0
    for item in step.items:
        end = offset + item.extend_len
        out.append(hidden[offset:end].float().tolist() if item.return_hidden_states else None)
        offset = end
    return out


def _mm_inputs(mm: list[MultimodalInputs | None]) -> list[MultimodalInputs | None] | None:
    """Each item's images / videos, or None when the step has none (the text path)."""
    return mm if any(m is not None for m in mm) else None


def _apply_vocab_mask(logits: torch.Tensor, mask: VocabMask) -> None:
    """Constrained rows of logits [S, V] get -inf where their grammar forbids the token,
    in one operation for the batch. Logprobs are then taken from the masked logits: the
    distribution actually sampled."""
    from radixlm.constrained.base_grammar_backend import apply_vocab_mask

    apply_vocab_mask(logits, mask.bitmask, mask.rows)


def _eos_ids(config: Any, model_dir: str) -> set[int]:
    ids: set[int] = set()
    for source in (config, _generation_config(model_dir)):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list | tuple):
            ids.update(int(e) for e in eos)
    return ids


def _generation_config(model_dir: str) -> Any:
    try:
        from transformers import GenerationConfig

        return GenerationConfig.from_pretrained(model_dir)
    except Exception:  # noqa: BLE001 - optional file
        return None
