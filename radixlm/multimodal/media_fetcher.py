"""Downloading media URLs: pinned to checked addresses, bounded, with one error text.

`MediaFetcher.fetch(url)` follows the URLPolicy (url_policy.py) on every hop:
resolve, check, then connect to that very address (the URL's host goes in the
Host header and, for https, in the TLS server name, so certificates are still
verified against it). Redirects are followed by hand, at most MAX_REDIRECTS.
One fetch, redirects and waiting for a slot included, takes at most `timeout`
seconds and `max_bytes` bytes.

Every failure raises `MediaFetchError` with the same text, FETCH_FAILED:
answers that differ by cause (refused, 404, timeout, private address) would
let a client map what the server can reach. The cause goes to the log.

`fetch_all` fetches a request's URLs concurrently: at most
MAX_FETCHES_PER_REQUEST at once per request and MAX_CONCURRENT_FETCHES for
the whole server, so slow URLs hold fetch slots, never the processing workers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from urllib.parse import urljoin

import httpx

from radixlm.multimodal.url_policy import BlockedURLError, FetchTarget, URLPolicy

logger = logging.getLogger(__name__)

MAX_REDIRECTS = 3
MAX_CONCURRENT_FETCHES = 16  # the whole server
MAX_FETCHES_PER_REQUEST = 4
FETCH_FAILED = ("Could not fetch the media URL: it is unreachable, not allowed, not found, "
                "too large or too slow (the server log has the reason)")
_REDIRECTS = (301, 302, 303, 307, 308)


class MediaFetchError(ValueError):
    """A media URL could not be fetched; the message is FETCH_FAILED. `index`: which
    URL of a `fetch_all` call failed."""

    def __init__(self, index: int = 0) -> None:
        super().__init__(FETCH_FAILED)
        self.index = index


class _Refused(Exception):
    """Why a fetch failed (logged, never shown to the client)."""


class MediaFetcher:
    def __init__(self, policy: URLPolicy, timeout: float, max_bytes: int,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        """`transport`: tests pass httpx.MockTransport; None is the network."""
        self.policy = policy
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.transport = transport
        self._slots: asyncio.Semaphore | None = None  # made on the serving loop

    @property
    def slots(self) -> asyncio.Semaphore:
        if self._slots is None:
            self._slots = asyncio.Semaphore(MAX_CONCURRENT_FETCHES)
        return self._slots

    async def fetch(self, url: str) -> bytes:
        """The body at `url`; MediaFetchError for any failure."""
        try:
            async with asyncio.timeout(self.timeout), self.slots:
                return await self._follow(url)
        except (TimeoutError, httpx.TimeoutException):
            logger.warning("Media URL %s not fetched: took more than %g s "
                           "(--media-fetch-timeout)", _short(url), self.timeout)
        except (_Refused, BlockedURLError, httpx.HTTPError, OSError) as e:
            logger.warning("Media URL %s not fetched: %s", _short(url), e or type(e).__name__)
        raise MediaFetchError()

    async def fetch_all(self, urls: Sequence[str]) -> list[bytes]:
        """Each URL's body, in order, fetched concurrently (see the module docstring)."""
        own = asyncio.Semaphore(MAX_FETCHES_PER_REQUEST)

        async def one(index: int, url: str) -> bytes:
            async with own:
                try:
                    return await self.fetch(url)
                except MediaFetchError as e:
                    raise MediaFetchError(index) from e

        tasks = [asyncio.ensure_future(one(i, u)) for i, u in enumerate(urls)]
        try:
            return list(await asyncio.gather(*tasks))
        finally:  # the first failure ends the others
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def fetch_sync(self, url: str) -> bytes:
        """`fetch` for a caller without an event loop (a worker thread)."""
        return asyncio.run(MediaFetcher(self.policy, self.timeout, self.max_bytes,
                                        self.transport).fetch(url))

    async def _follow(self, url: str) -> bytes:
        # NOTE: a client per fetch, without keep-alive: pooled connections are keyed by
        # the address, and one opened for one host name must not serve another.
        async with httpx.AsyncClient(transport=self.transport, trust_env=False,
                                     follow_redirects=False,
                                     timeout=self.timeout) as client:
            for _ in range(MAX_REDIRECTS + 1):
                target = await self.policy.resolve(url)
                async with client.stream("GET", _pinned_url(target),
                                         headers={"Host": _host_header(target)},
                                         extensions=_tls_name(target)) as resp:
                    if resp.status_code in _REDIRECTS and "location" in resp.headers:
                        url = urljoin(url, resp.headers["location"])
                        continue
                    if resp.status_code != 200:
                        raise _Refused(f"HTTP {resp.status_code}")
                    return await self._read(resp)
        raise _Refused(f"more than {MAX_REDIRECTS} redirects")

    async def _read(self, resp: httpx.Response) -> bytes:
        declared = resp.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            raise _Refused(f"{declared} bytes, more than --max-media-bytes ({self.max_bytes})")
        chunks: list[bytes] = []
        size = 0
        async for chunk in resp.aiter_bytes():
            size += len(chunk)
            if size > self.max_bytes:
                raise _Refused(f"more than --max-media-bytes ({self.max_bytes})")
            chunks.append(chunk)
        return b"".join(chunks)


def _pinned_url(target: FetchTarget) -> httpx.URL:
    """The URL with its host replaced by the checked address."""
    return httpx.URL(target.url).copy_with(host=target.address, port=target.port)


def _host_header(target: FetchTarget) -> str:
    host = f"[{target.host}]" if ":" in target.host else target.host
    default = 443 if target.scheme == "https" else 80
    return host if target.port == default else f"{host}:{target.port}"


def _tls_name(target: FetchTarget) -> dict[str, str]:
    return {"sni_hostname": target.host} if target.scheme == "https" else {}


def _short(url: str, limit: int = 200) -> str:
    return url if len(url) <= limit else url[:limit] + "..."
