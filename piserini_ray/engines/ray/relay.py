"""A loopback endpoint of the driver's node (the offline provider a run starts, a model server
on the driver's 127.0.0.1), reached from a replica on another node.

On a real cluster each host has its own 127.0.0.1, so a replica on another node that called the
driver's `http://127.0.0.1:PORT/v1` would reach nothing there. So such a replica runs a relay in
its own event loop (no process of its own: a worker process per node took seconds of CPU at
every run's start): an HTTP server on *its* 127.0.0.1 that its model client calls, and that
sends every request, through Ray, to the job's actor on the driver's node
(`driver_services.py`), which sends it to the endpoint itself (`forward`: only to a loopback
endpoint). There is still one provider behind them all: its quotas, faults and bill stay
cluster-wide, as a real provider's account is.

A relay admits only its own replica's client. Any process of the node can reach its
127.0.0.1, so the URL the client is given carries a secret as its first path segment
(`http://127.0.0.1:PORT/<secret>/v1`), made in the replica and never sent anywhere: the relay
checks it (in constant time) and strips it before forwarding, and refuses anything else with a
403. It forwards only the endpoint's own path prefix (`/v1/...`, no `..`) and the methods a
model client uses (`METHODS`), with bodies up to `MAX_BODY`; the driver's side checks the same
again (`forward`).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import secrets
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from piserini_ray.llm.scrubber import hold

#: Headers that describe one hop of HTTP, not the message: each side sets its own.
_HOP_BY_HOP = {
    "connection",
    "content-length",
    "content-encoding",
    "host",
    "keep-alive",
    "transfer-encoding",
}
#: What a model client sends: POST for calls (chat, responses, messages, batch and file
#: creation), GET for reading (a batch's state, a file's content).
METHODS = frozenset({"GET", "POST"})
#: The largest body a relay admits. A request is one conversation: the largest context any
#: model here takes is 1M tokens, about 4 MB of text, which JSON escaping (`\uXXXX` for
#: non-ASCII text) can grow to about 24 MB at worst; 32 MiB admits that and nothing near
#: the 1 GiB that was admitted before.
MAX_BODY = 32 << 20


def admitted_path(path: str, prefix: str) -> bool:
    """Whether `path` (decoded, without the query) lies under the endpoint's own `prefix`
    (`/v1`), with no `.` or `..` segment and no empty segment (`//`)."""
    if prefix and not (path == prefix or path.startswith(prefix + "/")):
        return False
    segments = path.split("/")[1:]
    return all(s not in ("", ".", "..") for s in segments) and not path.endswith("/")


def is_loopback(api_base: str | None) -> bool:
    """Whether an endpoint is on the loopback of the host that named it."""
    if not api_base:
        return False
    host = urlsplit(api_base).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def forward(
    session: Any,
    origin: str,
    method: str,
    path: str,
    headers: list[tuple[str, str]],
    body: bytes,
) -> tuple[int, list[tuple[str, str]], bytes]:
    """On the driver's node (`driver_services.DriverServices.forward`): send a forwarded
    request to the loopback endpoint at `origin` (`http://127.0.0.1:PORT/v1`) with the aiohttp
    `session`; its status, headers and body."""
    parts = urlsplit(origin)
    root, prefix = urlunsplit((parts.scheme, parts.netloc, "", "", "")), parts.path.rstrip("/")
    # The relays check this already; the driver's side holds to it too (it is what reaches
    # the endpoint), and reaches nothing but a loopback endpoint.
    if not is_loopback(origin):
        return 403, [], b"relay: not a loopback endpoint"
    if method not in METHODS or not admitted_path(urlsplit(path).path, prefix):
        return 403, [], b"relay: not a request of this endpoint"
    if len(body) > MAX_BODY:
        return 413, [], b"relay: request body too large"
    async with session.request(method, root + path, headers=headers, data=body) as reply:
        content = await reply.read()
        kept = [(k, v) for k, v in reply.headers.items() if k.lower() not in _HOP_BY_HOP]
        return reply.status, kept, content


class Relay:
    """In a replica on another node: the HTTP server on that node's 127.0.0.1, in the
    replica's event loop, that forwards to the driver's node (see the module's docstring)."""

    def __init__(self, origin: str, proxy: Callable[[], Any]) -> None:
        """`origin`: the endpoint on the driver's node (`http://127.0.0.1:PORT/v1`); `proxy`:
        gives the job's actor there (the replica's `_driver_services`, a blocking lookup:
        called off the event loop, at the first request, until it succeeds)."""
        self.origin = origin
        self.prefix = urlsplit(origin).path.rstrip("/")  # kept in the URL it hands out
        self._find_proxy = proxy
        self._proxy: Any = None
        self._secret = secrets.token_urlsafe(32)
        hold(self._secret)  # never printed nor kept by this process
        self._runner: Any = None
        self._url: str | None = None
        self._lock = asyncio.Lock()

    async def url(self) -> str:
        """Start listening (once) and return the endpoint's URL on this node."""
        from aiohttp import web

        async with self._lock:
            if self._url is None:
                app = web.Application(client_max_size=MAX_BODY)
                app.router.add_route("*", "/{tail:.*}", self._forward)
                runner = web.AppRunner(app, access_log=None)
                await runner.setup()
                site = web.TCPSite(runner, "127.0.0.1", 0)
                await site.start()
                self._runner = runner
                port = runner.addresses[0][1]
                self._url = f"http://127.0.0.1:{port}/{self._secret}{self.prefix}"
            return self._url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner, self._url = None, None

    async def _forward(self, request: Any) -> Any:
        from aiohttp import web

        given, _, rest = request.raw_path.lstrip("/").partition("/")
        if not hmac.compare_digest(given.encode(), self._secret.encode()):
            return web.Response(status=403, text="relay: this replica's client only")
        path = "/" + rest
        if not admitted_path(urlsplit(path).path, self.prefix) or "%" in urlsplit(path).path:
            return web.Response(status=404, text="relay: not a path of this endpoint")
        if request.method not in METHODS:
            return web.Response(status=405, text="relay: not a method of this endpoint")
        if (request.content_length or 0) > MAX_BODY:
            return web.Response(status=413, text="relay: request body too large")
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP]
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return web.Response(status=413, text="relay: request body too large")
        try:
            if self._proxy is None:
                self._proxy = await asyncio.to_thread(self._find_proxy)
            status, reply_headers, content = await self._proxy.forward.remote(
                self.origin, request.method, path, headers, body
            )
        except Exception as exc:  # the driver's node (or its actor) is gone: a 502, as a proxy
            return web.Response(status=502, text=f"relay: the driver's endpoint is gone: {exc}")
        return web.Response(status=status, headers=reply_headers, body=content)


def relayed(api_base: str | None, node_id: str, driver_node: str) -> bool:
    """Whether a replica on `node_id` reaches `api_base` through a relay: a loopback endpoint
    of the driver's node, from any other node."""
    return node_id != driver_node and is_loopback(api_base)
