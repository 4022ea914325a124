"""Endpoints every node can reach: a loopback endpoint of the driver's node (the offline
provider a run starts, on the driver's 127.0.0.1) served on every other node.

On a real cluster each host has its own 127.0.0.1, so a replica on another node that called the
driver's `http://127.0.0.1:PORT/v1` would reach nothing there. So each such node gets a small
gateway actor that listens on *its* 127.0.0.1 and forwards every request, through Ray, to the
job's actor on the driver's node (`driver_services.py`), which sends it to the endpoint itself
(`forward`: only to a loopback endpoint). There is still one
provider behind them all: its quotas, faults and bill stay cluster-wide, as a real provider's
account is.

A gateway admits only the run's replicas. Any process of the node can reach its 127.0.0.1, so
the URL a replica is handed carries a per-run secret as its first path segment
(`http://127.0.0.1:PORT/<secret>/v1`): the gateway checks it (in constant time) and strips it
before forwarding, and refuses anything else with a 403. It forwards only the endpoint's own
path prefix (`/v1/...`, no `..`) and the methods a model client uses (`METHODS`), with bodies up
to `MAX_BODY`. The secret reaches the gateway by a method call (never a creation argument,
which Ray keeps in the GCS) and is scrubbed from what the driver writes.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import secrets
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from piserini_ray.llm.secrets import hold

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
#: The largest body a gateway admits. A request is one conversation: the largest context any
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


def _pinned(node_id: str) -> NodeAffinitySchedulingStrategy:
    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


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
    # The gateways check this already; the proxy holds to it too (it is what reaches the
    # endpoint), and reaches nothing but a loopback endpoint.
    if not is_loopback(origin):
        return 403, [], b"gateway: not a loopback endpoint"
    if method not in METHODS or not admitted_path(urlsplit(path).path, prefix):
        return 403, [], b"gateway: not a request of this endpoint"
    if len(body) > MAX_BODY:
        return 413, [], b"gateway: request body too large"
    async with session.request(method, root + path, headers=headers, data=body) as reply:
        content = await reply.read()
        kept = [(k, v) for k, v in reply.headers.items() if k.lower() not in _HOP_BY_HOP]
        return reply.status, kept, content


@ray.remote(num_cpus=0, max_concurrency=1000)  # type: ignore[call-overload]
class NodeGateway:
    """On another node: an HTTP server on that node's 127.0.0.1 that forwards to the proxy."""

    def __init__(self, proxy: Any = None, origin: str = "") -> None:
        """`proxy`, `origin`: the actor that forwards for it on the driver's node
        (`driver_services.py`) and the endpoint (`http://127.0.0.1:PORT/v1`); a gateway
        started ahead of its endpoint (`Gateways.warm`) is given them by its first `url`
        call."""
        self.proxy = proxy
        self.origin = origin
        self.prefix = urlsplit(origin).path.rstrip("/")  # kept in the URL it hands out
        self._url: str | None = None
        self._secret = ""
        self._lock = asyncio.Lock()

    async def url(self, secret: str, proxy: Any = None, origin: str | None = None) -> str:
        """Start listening (once) and return the endpoint's URL on this node, under the
        run's `secret` (the first path segment every request must carry); `proxy` and
        `origin`, if given, are the endpoint's (for a gateway started without them)."""
        from aiohttp import web

        async with self._lock:
            if self._url is None:
                if len(secret) < 32:
                    raise ValueError("a gateway's secret has at least 32 characters")
                self.proxy = proxy if proxy is not None else self.proxy
                if origin is not None:
                    self.origin, self.prefix = origin, urlsplit(origin).path.rstrip("/")
                if self.proxy is None:
                    raise ValueError("a gateway needs its endpoint's proxy")
                self._secret = secret
                hold(secret)  # never printed by this process
                app = web.Application(client_max_size=MAX_BODY)
                app.router.add_route("*", "/{tail:.*}", self._forward)
                runner = web.AppRunner(app, access_log=None)
                await runner.setup()
                site = web.TCPSite(runner, "127.0.0.1", 0)
                await site.start()
                port = runner.addresses[0][1]
                self._runner = runner
                self._url = f"http://127.0.0.1:{port}/{secret}{self.prefix}"
            elif not hmac.compare_digest(secret, self._secret):
                raise ValueError("this gateway serves another run")
            return self._url

    async def _forward(self, request: Any) -> Any:
        from aiohttp import web

        given, _, rest = request.raw_path.lstrip("/").partition("/")
        if not self._secret or not hmac.compare_digest(given.encode(), self._secret.encode()):
            return web.Response(status=403, text="gateway: this run's replicas only")
        path = "/" + rest
        if not admitted_path(urlsplit(path).path, self.prefix) or "%" in urlsplit(path).path:
            return web.Response(status=404, text="gateway: not a path of this endpoint")
        if request.method not in METHODS:
            return web.Response(status=405, text="gateway: not a method of this endpoint")
        if (request.content_length or 0) > MAX_BODY:
            return web.Response(status=413, text="gateway: request body too large")
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP]
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return web.Response(status=413, text="gateway: request body too large")
        try:
            status, reply_headers, content = await self.proxy.forward.remote(
                self.origin, request.method, path, headers, body
            )
        except Exception as exc:  # the proxy (or the driver's node) is gone: a 502, as a proxy
            return web.Response(status=502, text=f"gateway: the driver's endpoint is gone: {exc}")
        return web.Response(status=status, headers=reply_headers, body=content)


class Gateways:
    """The driver's view: for each loopback endpoint of its node, one gateway on each other
    node that needs it, kept for the job, each forwarding through the job's actor on the
    driver's node (`driver_services.py`, which also holds the limiters: not stopped here).
    `warm` starts gateways before their endpoint is known (a worker process boots in seconds:
    meanwhile the replicas start and the driver checks the data), `prepare` hands them their
    endpoint (or starts them) before the replicas are placed; `api_base` starts any still
    missing and waits for its URL."""

    def __init__(self, proxy: Callable[[], Any]) -> None:
        """`proxy`: the actor on the driver's node that sends the requests to the endpoint
        (started, or found, when a gateway first needs it: `driver_services.driver_services`)."""
        self.proxy = proxy
        self.driver_node = ray.get_runtime_context().get_node_id()
        #: What admits a request to this run's gateways (see the module's docstring).
        self.secret = secrets.token_urlsafe(32)
        hold(self.secret)
        #: Each gateway's URL, or the ref of its `url` call while it starts.
        self._urls: dict[tuple[str, str], Any] = {}
        self._actors: list[Any] = []
        #: Gateways started ahead of any endpoint, by node id (`warm`).
        self._warm: dict[str, Any] = {}

    def warm(self, nodes: list[str]) -> None:
        """Start a gateway without its endpoint on each of `nodes` but the driver's: the
        first loopback endpoint that needs one there takes it."""
        for node in nodes:
            if node != self.driver_node and node not in self._warm:
                self._warm[node] = NodeGateway.options(  # type: ignore[attr-defined]
                    scheduling_strategy=_pinned(node)
                ).remote()
                self._actors.append(self._warm[node])

    def prepare(self, api_base: str | None, nodes: list[str]) -> None:
        """Start, without waiting, what a loopback `api_base` needs on `nodes` (ids; the
        driver's own needs none)."""
        if api_base is None or not is_loopback(api_base):
            return
        for node in nodes:
            if node != self.driver_node:
                self._start(api_base, node)

    def _start(self, api_base: str, node_id: str) -> None:
        key = (api_base, node_id)
        if key in self._urls:
            return
        proxy = self.proxy()
        if node_id in self._warm:
            self._urls[key] = self._warm.pop(node_id).url.remote(self.secret, proxy, api_base)
            return
        gateway = NodeGateway.options(  # type: ignore[attr-defined]
            scheduling_strategy=_pinned(node_id)
        ).remote(proxy, api_base)
        self._actors.append(gateway)
        self._urls[key] = gateway.url.remote(self.secret)

    def api_base(self, api_base: str | None, node_id: str) -> str | None:
        """The URL under which a replica on `node_id` reaches `api_base`."""
        if api_base is None or node_id == self.driver_node or not is_loopback(api_base):
            return api_base
        key = (api_base, node_id)
        self._start(api_base, node_id)
        if not isinstance(self._urls[key], str):
            self._urls[key] = ray.get(self._urls[key], timeout=60)
        return str(self._urls[key])

    def close(self) -> None:
        for actor in self._actors:
            ray.kill(actor)
        self._actors.clear()
        self._urls.clear()
        self._warm.clear()
