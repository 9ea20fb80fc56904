"""Cross-site protection: what a web page in the user's browser must not make us do.

A page on another site can send requests to a server on the user's machine:
a "simple" POST (`Content-Type: text/plain`, no CORS preflight) reaches
/generate, an <img src> GET reaches any GET route, and DNS rebinding lets the
page's own host name point at 127.0.0.1. Browsers mark such requests, curl and
SDKs do not, so `CrossSiteMiddleware` refuses what a browser marks as foreign
and lets everything else through (`curl -d` sends a form content type and no
Origin: it keeps working):

- Host (against DNS rebinding): when the server is bound to a loopback address,
  only `localhost` and loopback addresses are accepted by default (400
  otherwise); `--allowed-hosts` sets the names (`*` for any, `*.example.com`
  for a domain and its subdomains). Bound to another address, any host is
  accepted unless `--allowed-hosts` is given.
- Origin: a request that carries one must be same-origin (the Origin's host
  and port are the Host header's: the server's own page) or listed in
  `--allowed-origins` (`*` for any); else 403. Without an Origin, a
  `Sec-Fetch-Site` of `cross-site` or `same-site` (another port of the same
  host is the same site, not the same origin) is refused the same way, except
  a top-level navigation (a link to the playground from another site: a GET
  whose page the user sees and no other site's script reads).
- The origins in `--allowed-origins` also get CORS headers (and preflights),
  so a page served elsewhere can read the answers.

State-changing routes are POST only (a GET is what <img> and links send).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from radixlm.entrypoints.http.middleware import header, send_error
from radixlm.server_args import ServerArgs

_DEFAULT_PORTS = {"http": 80, "https": 443}


def is_loopback_host(host: str) -> bool:
    """`localhost` or a loopback address (127.0.0.0/8, ::1)."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def default_allowed_hosts(bind_host: str) -> list[str] | None:
    """The Host names accepted when --allowed-hosts is not given (None: any)."""
    return ["localhost", "127.0.0.0/8", "::1"] if is_loopback_host(bind_host) else None


def split_host(value: str) -> tuple[str, int | None]:
    """(host, port) of a Host header value ("[::1]:8000" → ("::1", 8000))."""
    try:
        parts = urlsplit(f"//{value}")
        return (parts.hostname or "").lower(), parts.port
    except ValueError:
        return "", None


def host_allowed(host: str, allowed: Sequence[str]) -> bool:
    """Whether `host` (no port) matches a pattern: a name, `*`, `*.domain` or a network."""
    for pattern in allowed:
        pattern = pattern.strip().lower().strip("[]")
        if pattern == "*" or host == pattern:
            return True
        if pattern.startswith("*.") and (host == pattern[2:] or host.endswith(pattern[1:])):
            return True
        if "/" in pattern or ":" in pattern or pattern[:1].isdigit():
            try:
                if ipaddress.ip_address(host) in ipaddress.ip_network(pattern, strict=False):
                    return True
            except ValueError:
                continue
    return False


def same_origin(origin: str, host_header: str) -> bool:
    """The Origin names the host and port this request was sent to."""
    try:
        parts = urlsplit(origin)
        origin_port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return False
    if not parts.hostname:
        return False
    host, port = split_host(host_header)
    return parts.hostname.lower() == host and origin_port == (port or _DEFAULT_PORTS.get(
        parts.scheme))


def _is_navigation(scope: Scope) -> bool:
    """A top-level browser navigation (typing, a link, a bookmark): GET, mode navigate,
    destination document (not an <img>, a fetch or a frame)."""
    mode = (header(scope, b"sec-fetch-mode") or b"").lower()
    dest = (header(scope, b"sec-fetch-dest") or b"document").lower()
    return scope.get("method") in ("GET", "HEAD") and mode == b"navigate" and dest == b"document"


class CrossSiteMiddleware:
    """Refuses foreign Host headers (400) and cross-site browser requests (403)."""

    def __init__(self, app: ASGIApp, allowed_hosts: Sequence[str] | None,
                 allowed_origins: Sequence[str]) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts
        self.allowed_origins = {o.rstrip("/").lower() for o in allowed_origins}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            problem = self.refusal(scope)
            if problem is not None:
                await send_error(send, *problem)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> tuple[int, str] | None:
        """(status, message) for a request to refuse, None for one to serve."""
        host_header = (header(scope, b"host") or b"").decode("latin-1")
        if self.allowed_hosts is not None and host_header:
            host, _ = split_host(host_header)
            if not host_allowed(host, self.allowed_hosts):
                return 400, (f"The Host header {host_header!r} is not allowed; start the "
                             f"server with --allowed-hosts to accept it")
        origin = header(scope, b"origin")
        if origin is not None:
            text = origin.decode("latin-1").rstrip("/")
            if "*" in self.allowed_origins or text.lower() in self.allowed_origins:
                return None
            if same_origin(text, host_header):
                return None
            return 403, (f"Cross-origin request from {text!r} refused; start the server "
                         f"with --allowed-origins to allow that origin")
        fetch_site = (header(scope, b"sec-fetch-site") or b"").decode("latin-1").lower()
        if fetch_site in ("cross-site", "same-site") and not _is_navigation(scope):
            return 403, ("Cross-site request refused (Sec-Fetch-Site: "
                         f"{fetch_site}); pages of other sites cannot use this server")
        return None


def _flag_list(values: Sequence[str] | None) -> list[str]:
    """A list flag's values, each of which may also be comma-separated."""
    return [v.strip() for value in values or [] for v in value.split(",") if v.strip()]


def install_cross_site_protection(app: Any, args: ServerArgs) -> None:
    """Add CORS for --allowed-origins, then the checks above (outermost: they run first)."""
    from starlette.middleware.cors import CORSMiddleware

    origins = _flag_list(args.allowed_origins)
    hosts = _flag_list(args.allowed_hosts) or default_allowed_hosts(args.host)
    if origins:
        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["*"],
                           allow_headers=["*"])
    app.add_middleware(CrossSiteMiddleware, allowed_hosts=hosts, allowed_origins=origins)
