"""Cross-site protection (radixlm/entrypoints/http/security.py): the helpers, and the flags
--allowed-hosts / --allowed-origins on the app over a fake runtime. The defaults are
tested on the real server in test_server_hardening.py."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
from _fake_runtime import FakeTokenizerManager, byte_tokenizer, fake_starter
from starlette.testclient import TestClient

from radixlm.entrypoints.http.security import (
    default_allowed_hosts,
    host_allowed,
    is_loopback_host,
    same_origin,
    split_host,
)
from radixlm.entrypoints.http.server import create_app
from radixlm.server_args import ServerArgs


@pytest.mark.parametrize("host,loopback", [
    ("localhost", True), ("LOCALHOST", True), ("127.0.0.1", True), ("127.3.2.1", True),
    ("::1", True), ("[::1]", True), ("0.0.0.0", False), ("10.0.0.1", False),
    ("example.com", False), ("localhost.example.com", False),
])
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback
    assert (default_allowed_hosts(host) is not None) is loopback


def test_host_patterns() -> None:
    loop = default_allowed_hosts("127.0.0.1")
    assert loop is not None
    for host in ("localhost", "127.0.0.1", "127.0.0.53", "::1"):
        assert host_allowed(host, loop), host
    for host in ("evil.example", "localhost.evil.example", "10.0.0.1", "0.0.0.0", ""):
        assert not host_allowed(host, loop), host
    assert host_allowed("api.example.com", ["*.example.com"])
    assert host_allowed("example.com", ["*.example.com"])
    assert not host_allowed("badexample.com", ["*.example.com"])
    assert host_allowed("10.1.2.3", ["10.0.0.0/8"]) and host_allowed("anything", ["*"])
    assert split_host("[::1]:8000") == ("::1", 8000)
    assert split_host("Example.COM") == ("example.com", None)


@pytest.mark.parametrize("origin,host,same", [
    ("http://127.0.0.1:30000", "127.0.0.1:30000", True),
    ("http://localhost", "localhost", True), ("https://example.com", "example.com", True),
    ("http://localhost:8080", "localhost:30000", False),  # same site, another origin
    ("http://evil.example", "127.0.0.1:30000", False), ("null", "127.0.0.1:30000", False),
    ("http://[::1]:30000", "[::1]:30000", True),
])
def test_same_origin(origin: str, host: str, same: bool) -> None:
    assert same_origin(origin, host) is same


# ---------------------------------------------------------------- the flags


@contextlib.contextmanager
def _client(base_url: str = "http://localhost", **flags: Any) -> Iterator[TestClient]:
    tm = FakeTokenizerManager(byte_tokenizer())
    with TestClient(create_app(ServerArgs(**flags), fake_starter(tm)),
                    raise_server_exceptions=False, base_url=base_url) as client:
        deadline = time.monotonic() + 10
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        yield client


BODY = {"text": "hi", "sampling_params": {"max_new_tokens": 2}}


def test_allowed_origins_get_cors_and_others_are_refused() -> None:
    with _client(allowed_origins=["http://app.example:8080,http://other.example"]) as c:
        for origin in ("http://app.example:8080", "http://other.example"):
            r = c.post("/generate", json=BODY, headers={"Origin": origin})
            assert r.status_code == 200, r.text
            assert r.headers["access-control-allow-origin"] == origin
        pre = c.options("/v1/chat/completions", headers={
            "Origin": "http://app.example:8080", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        assert pre.status_code == 200 and "POST" in pre.headers["access-control-allow-methods"]
        r = c.post("/generate", json=BODY, headers={"Origin": "http://evil.example"})
        assert r.status_code == 403 and "--allowed-origins" in r.json()["message"]
    with _client(allowed_origins=["*"]) as c:
        assert c.post("/generate", json=BODY, headers={"Origin": "http://x.example"}
                      ).status_code == 200


def test_allowed_hosts_and_non_loopback_binds() -> None:
    with _client("http://api.example.com", allowed_hosts=["api.example.com"]) as c:
        assert c.get("/health", headers={"Host": "api.example.com"}).status_code == 200
        r = c.get("/health", headers={"Host": "localhost"})  # the flag replaces the default
        assert r.status_code == 400 and "--allowed-hosts" in r.json()["message"]
    with _client(host="0.0.0.0") as c:  # bound to every address: any Host by default
        assert c.get("/health", headers={"Host": "10.1.2.3:30000"}).status_code == 200
    with _client(allowed_hosts=["*"]) as c:
        assert c.get("/health", headers={"Host": "rebound.example"}).status_code == 200
