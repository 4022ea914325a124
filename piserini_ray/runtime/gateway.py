"""Endpoints every node can reach: a loopback endpoint of the driver's node (the offline
provider a run starts, on the driver's 127.0.0.1) served on every other node.

On a real cluster each host has its own 127.0.0.1, so a replica on another node that called the
driver's `http://127.0.0.1:PORT/v1` would reach nothing there. So each such node gets a small
gateway actor that listens on *its* 127.0.0.1 and forwards every request, through Ray, to one
proxy actor on the driver's node, which sends it to the endpoint itself. There is still one
provider behind them all: its quotas, faults and bill stay cluster-wide, as a real provider's
account is.
"""

from __future__ import annotations

import asyncio
import ipaddress
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

#: Headers that describe one hop of HTTP, not the message: each side sets its own.
_HOP_BY_HOP = {
    "connection",
    "content-length",
    "content-encoding",
    "host",
    "keep-alive",
    "transfer-encoding",
}


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


def _pinned(node_id: str) -> NodeAffinitySchedulingStrategy:
    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


@ray.remote(num_cpus=0, max_concurrency=1000)  # type: ignore[call-overload]
class EndpointProxy:
    """On the driver's node: sends each forwarded request to the endpoint itself."""

    def __init__(self, origin: str) -> None:
        parts = urlsplit(origin)
        self.origin = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
        self._session: Any = None

    async def forward(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        import aiohttp

        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=None)  # the caller's call_timeout governs
            self._session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
        async with self._session.request(
            method, self.origin + path, headers=headers, data=body
        ) as reply:
            content = await reply.read()
            kept = [(k, v) for k, v in reply.headers.items() if k.lower() not in _HOP_BY_HOP]
            return reply.status, kept, content


@ray.remote(num_cpus=0, max_concurrency=1000)  # type: ignore[call-overload]
class NodeGateway:
    """On another node: an HTTP server on that node's 127.0.0.1 that forwards to the proxy."""

    def __init__(self, proxy: Any, prefix: str) -> None:
        self.proxy = proxy
        self.prefix = prefix  # the endpoint's path (`/v1`), kept in the URL it hands out
        self._url: str | None = None
        self._lock = asyncio.Lock()

    async def url(self) -> str:
        """Start listening (once) and return the endpoint's URL on this node."""
        from aiohttp import web

        async with self._lock:
            if self._url is None:
                app = web.Application(client_max_size=1 << 30)
                app.router.add_route("*", "/{tail:.*}", self._forward)
                runner = web.AppRunner(app, access_log=None)
                await runner.setup()
                site = web.TCPSite(runner, "127.0.0.1", 0)
                await site.start()
                port = runner.addresses[0][1]
                self._runner = runner
                self._url = f"http://127.0.0.1:{port}{self.prefix}"
            return self._url

    async def _forward(self, request: Any) -> Any:
        from aiohttp import web

        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP]
        body = await request.read()
        try:
            status, reply_headers, content = await self.proxy.forward.remote(
                request.method, request.path_qs, headers, body
            )
        except Exception as exc:  # the proxy (or the driver's node) is gone: a 502, as a proxy
            return web.Response(status=502, text=f"gateway: the driver's endpoint is gone: {exc}")
        return web.Response(status=status, headers=reply_headers, body=content)


class Gateways:
    """The driver's view: for each loopback endpoint of its node, one proxy there and one
    gateway on each other node that needs it, started on first use and kept for the job."""

    def __init__(self) -> None:
        self.driver_node = ray.get_runtime_context().get_node_id()
        self._proxies: dict[str, Any] = {}
        self._urls: dict[tuple[str, str], str] = {}
        self._actors: list[Any] = []

    def api_base(self, api_base: str | None, node_id: str) -> str | None:
        """The URL under which a replica on `node_id` reaches `api_base`."""
        if api_base is None or node_id == self.driver_node or not is_loopback(api_base):
            return api_base
        key = (api_base, node_id)
        if key not in self._urls:
            if api_base not in self._proxies:
                self._proxies[api_base] = EndpointProxy.options(  # type: ignore[attr-defined]
                    scheduling_strategy=_pinned(self.driver_node)
                ).remote(api_base)
                self._actors.append(self._proxies[api_base])
            gateway = NodeGateway.options(  # type: ignore[attr-defined]
                scheduling_strategy=_pinned(node_id)
            ).remote(self._proxies[api_base], urlsplit(api_base).path.rstrip("/"))
            self._actors.append(gateway)
            self._urls[key] = ray.get(gateway.url.remote(), timeout=60)
        return self._urls[key]

    def close(self) -> None:
        for actor in self._actors:
            ray.kill(actor)
        self._actors.clear()
        self._proxies.clear()
        self._urls.clear()
