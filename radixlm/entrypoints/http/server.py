"""The HTTP server: a FastAPI app over one engine, run by uvicorn.

    run_server(args)  →  exit code
      ├─ bind args.host:args.port first (a busy port fails at once); /health
      │    answers 503 from the start
      ├─ lifespan: ServerState.start() launches the runtime in the background:
      │    scheduler + detokenizer processes, tokenizer, TokenizerManager;
      │    once the scheduler reports ready, /health answers 200
      ├─ SIGTERM / SIGINT: refuse new requests, abort the running ones (they
      │    finish with "abort"), let uvicorn finish the responses, stop the
      │    children, exit 0
      └─ a child process dies (or start-up fails): pending requests fail with
           503, the server stops and exits 1 instead of hanging

`create_app(args, start_runtime)` builds the app alone, so tests can drive it
with a fake runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Iterator
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

from radixlm import __version__
from radixlm.entrypoints.anthropic import serving as anthropic_api
from radixlm.entrypoints.http.error_shapes import ErrorShapeMiddleware
from radixlm.entrypoints.http.errors import install_error_handlers
from radixlm.entrypoints.http.middleware import install_middleware
from radixlm.entrypoints.http.security import install_cross_site_protection
from radixlm.entrypoints.http.state import RuntimeStarter, ServerState
from radixlm.entrypoints.native import api as native_api
from radixlm.entrypoints.native import control as control_api
from radixlm.entrypoints.native import sglang as sglang_api
from radixlm.entrypoints.ollama import api as ollama_api
from radixlm.entrypoints.openai import api as openai_api
from radixlm.entrypoints.openai import batch_api
from radixlm.entrypoints.openai.batch_api import run_in_process
from radixlm.entrypoints.openai.batch_manager import BatchManager
from radixlm.entrypoints.openai.file_store import FileStore
from radixlm.entrypoints.playground import routes as playground
from radixlm.server_args import ServerArgs
from radixlm.utils import PortArgs, configure_logging

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT = 900.0  # seconds for the scheduler to load the model
GRACEFUL_SHUTDOWN_TIMEOUT = 10  # seconds for responses to finish after SIGTERM


class ProcessRuntime:
    """The real runtime: child processes plus a TokenizerManager on this loop."""

    def __init__(self, tokenizer_manager: Any, procs: list[Any], ports: PortArgs) -> None:
        self.tokenizer_manager = tokenizer_manager
        self.procs = procs
        self.ports = ports

    @classmethod
    async def start(cls, args: ServerArgs) -> ProcessRuntime:
        from radixlm.entrypoints.launch import make_is_alive, start_children, stop_children
        from radixlm.layers.cpu_kernels import prepare_cpu_kernels
        from radixlm.model_loader.model_path import resolve_model_dir
        from radixlm.tokenizer.tokenizer_manager import TokenizerManager
        from radixlm.tokenizer_utils import load_tokenizer

        model_dir = await asyncio.to_thread(resolve_model_dir, args.model_path, True)  # GGUF: slow
        # A kernel build (a CPU the install does not cover) happens here, logged as it
        # goes, not under the scheduler's STARTUP_TIMEOUT.
        await asyncio.to_thread(prepare_cpu_kernels, args.device)
        ports, procs = start_children(args, model_dir)  # on the main thread: see launch.py
        try:
            tokenizer = (None if args.skip_tokenizer_init else
                         await asyncio.to_thread(load_tokenizer, args.tokenizer_path or model_dir))
            tm = TokenizerManager(args, model_dir, ports, tokenizer)
            tm.start(make_is_alive(procs))
            await tm.wait_ready(STARTUP_TIMEOUT)
        except BaseException:
            stop_children(procs, ports)
            raise
        return cls(tm, procs, ports)

    async def shutdown(self) -> None:
        from radixlm.entrypoints.launch import stop_children

        self.tokenizer_manager.close()  # first: its watchdog must not see the children stop
        await asyncio.to_thread(stop_children, self.procs, self.ports)


def create_app(args: ServerArgs, start_runtime: RuntimeStarter | None = None) -> FastAPI:
    """The app; `start_runtime` defaults to ProcessRuntime.start.

    Raises ValueError for a bad --chat-template, OSError for a --file-storage-path
    that cannot be created.
    """
    state = ServerState(args, start_runtime or ProcessRuntime.start)
    files = FileStore(args.file_storage_dir, args.file_storage_max_bytes)  # OSError: bad path

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.start()
        batches = BatchManager(args.file_storage_dir, files, run_in_process(app, state),
                               concurrency=max(1, args.max_running_requests // 2),
                               is_ready=state.wait_serving)
        app.state.batches = batches
        batches.start()
        try:
            yield
        finally:
            await batches.stop()
            await state.stop()

    app = FastAPI(title="radixlm", version=__version__, lifespan=lifespan)
    app.state.server = state
    app.state.files = files
    install_error_handlers(app)
    install_middleware(app, args.api_key, args.max_request_bytes)
    install_cross_site_protection(app, args)  # before the key and size checks
    app.add_middleware(ErrorShapeMiddleware)  # outermost: Anthropic's and Ollama's error bodies
    app.include_router(native_api.router)
    app.include_router(control_api.router)
    app.include_router(openai_api.router)
    app.include_router(batch_api.router)
    app.include_router(sglang_api.router)
    app.include_router(anthropic_api.router)
    app.include_router(ollama_api.router)
    app.include_router(playground.router)
    return app


class _Server(uvicorn.Server):
    """uvicorn's server with our SIGTERM behaviour: drain first, and no re-raised
    signal at the end (so the children are stopped and the exit code is ours)."""

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.state.begin_drain()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def run_server(args: ServerArgs) -> int:
    """Serve until SIGTERM/SIGINT (exit code 0) or a fatal engine failure (1)."""
    configure_logging(args.log_level)
    from radixlm.entrypoints.launch import prepare_environment

    prepare_environment()
    try:
        app = create_app(args)
    except (ValueError, OSError) as e:
        logger.error("%s", e)
        return 2
    state: ServerState = app.state.server
    config = uvicorn.Config(app, host=args.host, port=args.port, loop="uvloop",
                            log_level=args.log_level.lower(),
                            access_log=args.log_level.lower() == "debug",
                            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_TIMEOUT,
                            timeout_keep_alive=30)
    server = _Server(config, state)

    def on_fatal() -> None:
        server.should_exit = True

    state.on_fatal = on_fatal
    try:
        sock = config.bind_socket()  # first, so a busy port fails before anything starts
    except SystemExit:
        return 1  # uvicorn logged why
    logger.info("Starting radixlm %s: model %s, http://%s:%d", __version__, state.model_name,
                args.host, args.port)
    server.run(sockets=[sock])
    return state.exit_code
