"""Which media URLs the server may fetch: the SSRF policy.

A request's image URL makes the server open a connection, so a client could
aim it at what only the server can reach (its own routes, 127.0.0.1, the
cloud metadata service at 169.254.169.254, the private network). By default
an URL is fetched only if every address its host resolves to is public:

- the host is resolved once, here; the fetcher connects to the address checked
  here (never resolving again, so DNS rebinding cannot swap it), and checks
  every redirect hop the same way;
- refused: loopback, private (RFC 1918, unique local), link-local, shared
  (100.64/10), multicast, unspecified, reserved and documentation ranges,
  anything `ipaddress` does not call global, and IPv6 forms that embed such an
  IPv4 address (mapped, 6to4, NAT64, Teredo).

`--allow-private-media-urls` lifts the address check (a trusted network where
images live on internal hosts); the scheme check (http/https) always holds.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[str]]]  # (host, port) -> IP addresses

_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class BlockedURLError(ValueError):
    """The URL may not be fetched; the message is for the server log only."""


@dataclass(frozen=True)
class FetchTarget:
    """One hop of a fetch: the URL's parts and the checked address to connect to."""

    url: str
    scheme: str  # "http" | "https"
    host: str  # as written in the URL (the Host header and TLS name)
    port: int
    address: str  # the resolved, allowed IP address to connect to


def is_public_address(ip: IPAddress) -> bool:
    """True for a globally routable unicast address (after unwrapping embedded IPv4)."""
    embedded = _embedded_ipv4(ip)
    if embedded is not None:
        return is_public_address(embedded)
    return ip.is_global and not ip.is_multicast


def _embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF)
    return None


async def system_resolve(host: str, port: int) -> list[str]:
    """The host's addresses from the system resolver (in the loop's executor)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


class URLPolicy:
    def __init__(self, allow_private: bool = False, resolve: Resolver = system_resolve) -> None:
        self.allow_private = allow_private
        self._resolve = resolve

    def split(self, url: str) -> tuple[str, str, int]:
        """(scheme, host, port) of an http(s) URL; BlockedURLError otherwise."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as e:
            raise BlockedURLError(f"malformed URL: {e}") from e
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            raise BlockedURLError(f"scheme {scheme!r} is not http or https")
        if not parts.hostname:
            raise BlockedURLError("the URL has no host")
        return scheme, parts.hostname, port or (443 if scheme == "https" else 80)

    async def resolve(self, url: str) -> FetchTarget:
        """The URL's target: its host resolved once, every address checked."""
        scheme, host, port = self.split(url)
        try:
            addresses = list(dict.fromkeys(await self._resolve(host, port)))
        except OSError as e:
            raise BlockedURLError(f"cannot resolve {host!r}: {e}") from e
        if not addresses:
            raise BlockedURLError(f"{host!r} has no address")
        if not self.allow_private:
            # NOTE: all, not any: a name that also resolves to a private address is refused,
            # whichever address a later resolution would have picked.
            blocked = [a for a in addresses if not is_public_address(_ip(a))]
            if blocked:
                raise BlockedURLError(f"{host!r} resolves to non-public address(es) "
                                      f"{', '.join(blocked)} (--allow-private-media-urls "
                                      f"allows them)")
        return FetchTarget(url, scheme, host, port, addresses[0])


def _ip(address: str) -> IPAddress:
    return ipaddress.ip_address(address.split("%", 1)[0])  # drop an IPv6 zone ("fe80::1%eth0")
