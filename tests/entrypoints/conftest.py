"""Fixtures for the end-to-end server tests.

One real server with the default model serves the whole session, started with
`--api-key` and `--enable-metrics` so those checks need no second start-up
(each costs ~10-30 s here). Its teardown is itself a test of SIGTERM: a
streaming request is running when the signal arrives; it must end with
finish_reason "abort", the server must exit 0, and no child process may
remain.
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _server_process import API_KEY, AUTH, ServerProcess


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = Path(tmp_path_factory.mktemp("server")) / "server.log"
    srv = ServerProcess(log, "--api-key", API_KEY, "--enable-metrics")
    try:
        srv.wait_healthy()
        yield srv
        _check_sigterm_drains(srv)
    finally:
        srv.stop(signal.SIGKILL, timeout=1)


def _check_sigterm_drains(srv: ServerProcess) -> None:
    events: list[Any] = []
    started = threading.Event()

    def stream() -> None:
        body = {"text": "Tell me a long story.", "stream": True,
                "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True}}
        with httpx.stream("POST", srv.url + "/generate", json=body, headers=AUTH,
                          timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    started.set()

    t = threading.Thread(target=stream)
    t.start()
    assert started.wait(60), srv.log_tail()
    srv.proc.send_signal(signal.SIGTERM)
    t.join(60)
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["meta_info"]["finish_reason"]["type"] == "abort"
    assert srv.wait_exit(60) == 0, srv.log_tail()
    assert not srv.group_alive(), "child processes outlived the server"


@pytest.fixture(scope="session")
def tokenizer(server: ServerProcess) -> Any:
    from transformers import AutoTokenizer

    from radixlm.model_loader.model_path import resolve_model_dir

    return AutoTokenizer.from_pretrained(resolve_model_dir(None))


@pytest.fixture(scope="session")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as c:
        yield c


@pytest.fixture(scope="session")
def oai(server: ServerProcess) -> Any:
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0,
                         timeout=120)
