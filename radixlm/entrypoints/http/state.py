"""What the HTTP routes share: the runtime once it is up, and the server's health.

Life of a server:
    loading ──ready──> serving ──SIGTERM──> draining ──> stopped (exit 0)
       │                  │
       └──── a child dies / start-up fails ──> fatal (exit 1)

`/health` is 200 only while serving. A route that needs the engine calls
`engine()`, which raises a 503 in every other state. The runtime is started by
a `RuntimeStarter` (the real one launches the scheduler and detokenizer
processes; tests pass a fake), in the background, so the port answers 503
while the model loads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from starlette.requests import Request

from radixlm.chat_template import ChatTemplate, load_chat_template, resolve_chat_template
from radixlm.entrypoints.http.errors import APIError
from radixlm.entrypoints.openai.agents import AgentSettings, choose_agent_settings
from radixlm.entrypoints.openai.response_store import ResponseStore
from radixlm.metrics import Metrics
from radixlm.server_args import ServerArgs

logger = logging.getLogger(__name__)


class Runtime(Protocol):
    """A started engine: its TokenizerManager, and how to stop it."""

    tokenizer_manager: Any

    async def shutdown(self) -> None: ...


RuntimeStarter = Callable[[ServerArgs], Awaitable[Runtime]]


class ServerState:
    def __init__(self, args: ServerArgs, start_runtime: RuntimeStarter) -> None:
        self.args = args
        self.model_name = args.model_name
        self.start_runtime = start_runtime
        self.chosen_template = load_chat_template(args.chat_template)  # ValueError: bad flag
        self.chat_template: ChatTemplate | None = None
        self.agents: AgentSettings | None = None  # tool and reasoning parsers, once ready
        self.metrics = Metrics(self.model_name) if args.enable_metrics else None
        self.responses = ResponseStore(args.max_stored_responses, args.stored_response_ttl)
        self.runtime: Runtime | None = None
        self.tm: Any = None
        self.ready = False
        self.draining = False
        self.fatal_reason: str | None = None
        self.on_fatal: Callable[[], None] | None = None  # the launcher stops the server
        self._task: asyncio.Task | None = None

    @property
    def exit_code(self) -> int:
        return 1 if self.fatal_reason else 0

    # ------------------------------------------------------------------ lifetime

    def start(self) -> None:
        """Start the runtime in the background (call from the running loop)."""
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            self.runtime = await self.start_runtime(self.args)
        except Exception as e:  # noqa: BLE001 - any start-up failure is fatal
            if not isinstance(e, FileNotFoundError | ValueError):  # else the message says it all
                logger.exception("The engine failed to start")
            self._fail(f"The engine failed to start: {e}")
            return
        self.tm = self.runtime.tokenizer_manager
        if self.tm.tokenizer is not None:  # else --skip-tokenizer-init: no chat at all
            self.chat_template = resolve_chat_template(self.chosen_template, self.tm.tokenizer)
            self.agents = choose_agent_settings(self.args, self.chat_template, self.tm.tokenizer,
                                                dict(self.tm.model_info or {}))
        if self.metrics is not None:
            self.tm.on_sample_finished = self.metrics.on_sample_finished
            self.tm.on_tokens = self.metrics.on_tokens
        self.ready = True
        a = self.args
        logger.info("radixlm is ready: serving %s at http://%s:%d (chat template: %s)",
                    self.model_name, a.host, a.port,
                    self.chat_template.name if self.chat_template else "none, no tokenizer")
        while not self.draining:  # watch for a child process dying
            if self.tm.dead_reason:
                self._fail(self.tm.dead_reason)
                return
            await asyncio.sleep(0.25)

    async def wait_serving(self) -> bool:
        """Wait until the engine serves; False if it never will (failed or stopping)."""
        while not self.ready:
            if self.fatal_reason or self.draining:
                return False
            await asyncio.sleep(0.1)
        return not (self.fatal_reason or self.draining)

    def _fail(self, reason: str) -> None:
        if self.fatal_reason is None and not self.draining:
            logger.error("Server is unhealthy and will exit: %s", reason)
            self.fatal_reason = reason
            if self.on_fatal is not None:
                self.on_fatal()

    def begin_drain(self) -> None:
        """On SIGTERM: refuse new requests and abort the running ones (they end with
        finish_reason "abort", so their responses complete before the server stops)."""
        if self.draining:
            return
        self.draining = True
        logger.info("Shutting down: aborting running requests")
        if self.tm is not None and not self.tm.dead_reason:
            self.tm.abort_request(abort_all=True, message="The server is shutting down")

    async def stop(self) -> None:
        """Stop the runtime (and its child processes)."""
        self.draining = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        if self.runtime is not None:
            await self.runtime.shutdown()
            self.runtime = None

    # ------------------------------------------------------------------ health

    def unhealthy_reason(self) -> str | None:
        """None while serving; otherwise why not."""
        if self.fatal_reason:
            return self.fatal_reason
        if self.draining:
            return "The server is shutting down"
        if not self.ready:
            return "The model is loading"
        if self.tm.dead_reason:
            return str(self.tm.dead_reason)
        return None

    def is_stuck(self) -> bool:
        """True when the scheduler holds requests and has sent nothing for longer than
        --watchdog-timeout (see TokenizerManager.stalled_seconds)."""
        tm = self.tm
        return tm is not None and tm.stalled_seconds() > self.args.watchdog_timeout

    def engine(self) -> Any:
        """The TokenizerManager; raise a 503 unless serving."""
        reason = self.unhealthy_reason()
        if reason is not None:
            raise APIError(reason, 503)
        return self.tm

    def tokenizer_engine(self, what: str) -> Any:
        """The TokenizerManager for a route that needs the tokenizer: a 400 with
        --skip-tokenizer-init (which loads none), a 503 unless serving."""
        tm = self.engine()
        if tm.tokenizer is None:
            raise APIError(f"{what} needs the tokenizer, and this server runs with "
                           "--skip-tokenizer-init: send token ids ('input_ids') to /generate",
                           400)
        return tm

    @property
    def is_generation(self) -> bool:
        """False for a model served for embeddings or classification (known once loaded)."""
        return bool(self.tm.model_info.get("is_generation", True)) if self.tm else True

    @property
    def context_length(self) -> int:
        return int(self.tm.model_info.get("context_length") or 0) if self.tm else 0


def state_of(request: Request) -> ServerState:
    """The ServerState of the app that serves `request`."""
    return request.app.state.server  # type: ignore[no-any-return]
