"""Media URL fetching: the SSRF policy, address pinning, redirects, limits, one error text.

Real fetches go to a loopback HTTP server started here; hosts that must look
public are faked with a resolver and httpx's MockTransport (no network).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from _tiny_llava import png_bytes

from radixlm.multimodal.media_fetcher import FETCH_FAILED, MediaFetcher, MediaFetchError
from radixlm.multimodal.url_policy import URLPolicy, is_public_address

PNG = png_bytes((40, 30))


@pytest.mark.parametrize("address,public", [
    ("8.8.8.8", True), ("2001:4860:4860::8888", True), ("93.184.216.34", True),
    ("127.0.0.1", False), ("127.8.9.10", False), ("10.1.2.3", False), ("172.16.0.1", False),
    ("192.168.1.1", False), ("169.254.169.254", False), ("100.64.0.1", False),
    ("0.0.0.0", False), ("224.0.0.1", False), ("233.252.0.1", False),
    ("255.255.255.255", False), ("198.18.0.1", False), ("::1", False), ("::", False),
    ("fe80::1", False), ("fc00::1", False), ("ff02::1", False),
    ("::ffff:127.0.0.1", False), ("::ffff:8.8.8.8", True),  # IPv4-mapped
    ("2002:7f00:1::", False), ("2002:808:808::", True),  # 6to4
    ("64:ff9b::7f00:1", False), ("64:ff9b::808:808", True),  # NAT64
])
def test_public_addresses(address: str, public: bool) -> None:
    assert is_public_address(ipaddress.ip_address(address)) is public


# ---------------------------------------------------------------- a loopback server


class _Handler(BaseHTTPRequestHandler):
    hits: list[str] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        _Handler.hits.append(self.path)
        try:
            self._answer()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _answer(self) -> None:
        if self.path == "/cat.png":
            self._send(PNG)
        elif self.path.startswith("/hop/"):  # /hop/N redirects N more times, then the cat
            left = int(self.path.rsplit("/", 1)[1])
            self.send_response(302)
            self.send_header("Location", f"/hop/{left - 1}" if left > 1 else "/cat.png")
            self.end_headers()
        elif self.path == "/big.png":
            self._send(b"\0" * 5000)
        elif self.path == "/undeclared.png":  # no Content-Length: the stream is counted
            self.send_response(200)
            self.end_headers()
            for _ in range(10):
                self.wfile.write(b"\0" * 1000)
        elif self.path == "/slow.png":
            time.sleep(1.5)
            self._send(PNG)
        else:
            self.send_response(404)
            self.end_headers()

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    _Handler.protocol_version = "HTTP/1.0"
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _fetch(fetcher: MediaFetcher, url: str) -> bytes:
    return asyncio.run(fetcher.fetch(url))


def test_private_addresses_are_refused_by_default(server_url: str) -> None:
    fetcher = MediaFetcher(URLPolicy(), timeout=2, max_bytes=1 << 20)
    port = server_url.rsplit(":", 1)[1]
    _Handler.hits.clear()
    for url in (server_url + "/cat.png", f"http://localhost:{port}/cat.png",
                f"http://127.1:{port}/cat.png", f"http://[::1]:{port}/cat.png",
                f"http://0.0.0.0:{port}/cat.png", f"http://[::ffff:127.0.0.1]:{port}/cat.png",
                "http://169.254.169.254/latest/meta-data/", "ftp://example.com/x.png",
                "http:///x.png"):
        with pytest.raises(MediaFetchError) as e:
            _fetch(fetcher, url)
        assert str(e.value) == FETCH_FAILED
    assert _Handler.hits == []  # refused before connecting


def test_opt_in_fetches_follow_redirects_and_keep_limits(server_url: str,
                                                         caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    fetcher = MediaFetcher(URLPolicy(allow_private=True), timeout=0.8, max_bytes=4096)
    assert _fetch(fetcher, server_url + "/cat.png") == PNG
    assert _fetch(fetcher, server_url + "/hop/3") == PNG  # three redirects: allowed
    caplog.set_level(logging.WARNING, logger="radixlm.multimodal.media_fetcher")
    for path, reason in [("/hop/4", "more than 3 redirects"), ("/nothing.png", "HTTP 404"),
                         ("/big.png", "5000 bytes"), ("/undeclared.png", "more than"),
                         ("/slow.png", "--media-fetch-timeout")]:
        caplog.clear()
        with pytest.raises(MediaFetchError) as e:
            _fetch(fetcher, server_url + path)
        assert str(e.value) == FETCH_FAILED  # the same text whatever the cause ...
        assert reason in caplog.text, (path, caplog.text)  # ... which only the log says
    caplog.clear()
    with pytest.raises(MediaFetchError):
        _fetch(fetcher, "http://127.0.0.1:1/x.png")  # nothing listens on port 1
    assert "not fetched" in caplog.text


# ---------------------------------------------------------------- hosts that look public

PUBLIC_IP = "93.184.216.34"
NAMES = {"media.example": [PUBLIC_IP], "inner.example": ["10.0.0.5"],
         "mixed.example": [PUBLIC_IP, "127.0.0.1"]}


async def _fake_resolve(host: str, port: int) -> list[str]:
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    if host not in NAMES:
        raise OSError("unknown host")
    return NAMES[host]


def _mock_fetcher(seen: list[httpx.Request], allow_private: bool = False) -> MediaFetcher:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.host != PUBLIC_IP:
            return httpx.Response(200, content=b"private data")
        routes = {"/cat.png": httpx.Response(200, content=PNG),
                  "/to-loopback": httpx.Response(302, headers={
                      "Location": "http://127.0.0.1:8080/admin"}),
                  "/to-inner": httpx.Response(301, headers={"Location": "http://inner.example/"}),
                  "/to-cat": httpx.Response(307, headers={"Location": "/cat.png"})}
        return routes.get(request.url.path, httpx.Response(404))

    return MediaFetcher(URLPolicy(allow_private, resolve=_fake_resolve), timeout=2,
                        max_bytes=1 << 20, transport=httpx.MockTransport(handle))


def test_connects_to_the_checked_address_with_the_host_name_kept() -> None:
    seen: list[httpx.Request] = []
    fetcher = _mock_fetcher(seen)
    assert _fetch(fetcher, "http://media.example/cat.png") == PNG
    assert _fetch(fetcher, "https://media.example:8443/to-cat") == PNG
    assert [(r.url.host, r.url.port, r.url.path) for r in seen] == [
        (PUBLIC_IP, None, "/cat.png"), (PUBLIC_IP, 8443, "/to-cat"), (PUBLIC_IP, 8443, "/cat.png")]
    assert [r.headers["host"] for r in seen] == ["media.example"] + ["media.example:8443"] * 2
    assert seen[1].extensions["sni_hostname"] == "media.example"  # TLS checks the name


@pytest.mark.parametrize("url", ["http://media.example/to-loopback",
                                 "http://media.example/to-inner", "http://mixed.example/cat.png"])
def test_redirects_and_names_to_private_addresses_are_refused(url: str) -> None:
    seen: list[httpx.Request] = []
    with pytest.raises(MediaFetchError):
        _fetch(_mock_fetcher(seen), url)
    assert all(r.url.host == PUBLIC_IP for r in seen)  # never connected past the check
    seen.clear()
    # With the opt-in the same hops are followed.
    assert _fetch(_mock_fetcher(seen, allow_private=True), url) in (b"private data", PNG)


def test_fetch_all_names_the_failing_url_and_bounds_concurrency(server_url: str) -> None:
    fetcher = MediaFetcher(URLPolicy(allow_private=True), timeout=5, max_bytes=1 << 20)
    with pytest.raises(MediaFetchError) as e:
        asyncio.run(fetcher.fetch_all([server_url + "/cat.png", server_url + "/nothing"]))
    assert e.value.index == 1
    start = time.monotonic()
    bodies = asyncio.run(fetcher.fetch_all([server_url + "/slow.png"] * 4))
    assert bodies == [PNG] * 4
    assert time.monotonic() - start < 2 * 1.5  # the four ran at once, not one by one
