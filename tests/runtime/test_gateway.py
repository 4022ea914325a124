"""A node's gateway admits only the run's replicas: its per-run secret, the endpoint's own path
prefix and methods, bodies up to `MAX_BODY`. The gateway class and the proxy's `forward` (what
the driver's node runs: `driver_services.DriverServices.forward`) run here as they are, without
Ray (the proxy's handle is awaited in the gateway's loop), over real HTTP, in front of a
provider that records what reaches it."""

from __future__ import annotations

import asyncio
import secrets
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "llm"))
from echo_provider import EchoProvider

from piserini_ray.runtime.gateway import MAX_BODY, NodeGateway, admitted_path, forward

Gateway = NodeGateway.__ray_actor_class__  # type: ignore[attr-defined]


class _Proxy:
    """What a Ray handle of the driver's actor gives the gateway: `proxy.forward.remote(...)`,
    awaited, here `gateway.forward` with a session of its own."""

    def __init__(self) -> None:
        self.forward = self
        self._session: Any = None

    def remote(self, *args: Any) -> Any:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(auto_decompress=False)
        return forward(self._session, *args)


@pytest.fixture
def served() -> Iterator[tuple[EchoProvider, str, str]]:
    """(the provider behind, the gateway's URL for this run, the run's secret)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    secret = secrets.token_urlsafe(32)
    with EchoProvider(answer_check=False, statuses=(400,)) as provider:
        proxy = _Proxy()
        gateway = Gateway(proxy, provider.base_url)
        url = asyncio.run_coroutine_threadsafe(gateway.url(secret), loop).result(30)
        yield provider, url, secret
        asyncio.run_coroutine_threadsafe(gateway._runner.cleanup(), loop).result(30)
        if proxy._session is not None:
            asyncio.run_coroutine_threadsafe(proxy._session.close(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_the_runs_replicas_get_through_with_the_secret_stripped(served) -> None:
    provider, url, secret = served
    assert url.endswith(f"/{secret}/v1")
    reply = httpx.post(f"{url}/chat/completions", json={"model": "m"}, timeout=30)
    assert reply.status_code == 400 and "request refused" in reply.text  # the provider's own
    ((method, path, headers),) = provider.requests
    assert (method, path) == ("POST", "/v1/chat/completions")
    assert secret not in str(headers)
    assert httpx.get(f"{url}/batches/b1", timeout=30).status_code == 400  # reading: GET


def test_strangers_wrong_paths_and_methods_are_refused_and_nothing_reaches_the_provider(
    served,
) -> None:
    provider, url, secret = served
    origin = url.removesuffix(f"/{secret}/v1")
    refused = {
        "no secret": httpx.post(f"{origin}/v1/chat/completions", json={}),
        "another secret": httpx.post(f"{origin}/{secrets.token_urlsafe(32)}/v1/chat/completions"),
        "a prefix of it": httpx.post(f"{origin}/{secret[:-1]}/v1/chat/completions"),
        "another prefix": httpx.post(f"{origin}/{secret}/admin/keys"),
        "dot-dot": httpx.post(f"{origin}/{secret}/v1/%2e%2e/admin"),
        "method": httpx.delete(f"{url}/files/f1"),
        "put": httpx.put(f"{url}/chat/completions", content=b"{}"),
        "too large": httpx.post(f"{url}/chat/completions", content=b"x" * (MAX_BODY + 1)),
    }
    statuses = {why: reply.status_code for why, reply in refused.items()}
    assert statuses == {
        "no secret": 403, "another secret": 403, "a prefix of it": 403, "another prefix": 404,
        "dot-dot": 404, "method": 405, "put": 405, "too large": 413,
    }  # fmt: skip
    assert provider.requests == []


def test_a_gateway_serves_one_run() -> None:
    loop = asyncio.new_event_loop()
    try:
        gateway = Gateway(_Proxy(), "http://127.0.0.1:9/v1")
        with pytest.raises(ValueError, match="32 characters"):
            loop.run_until_complete(gateway.url("short"))
        loop.run_until_complete(gateway.url("s" * 32))
        with pytest.raises(ValueError, match="another run"):
            loop.run_until_complete(gateway.url("t" * 32))
        loop.run_until_complete(gateway._runner.cleanup())
    finally:
        loop.close()


@pytest.mark.parametrize(
    ("path", "ok"),
    [("/v1/chat/completions", True), ("/v1", True), ("/v1x/chat", False), ("/v2/a", False),
     ("/v1/../admin", False), ("/v1//x", False), ("/v1/./x", False), ("/v1/x/", False)],
)  # fmt: skip
def test_only_the_endpoints_own_prefix(path: str, ok: bool) -> None:
    assert admitted_path(path, "/v1") is ok


def test_the_proxy_reaches_only_a_loopback_endpoint_and_its_own_paths() -> None:
    """The driver's side holds to the gateway's rules too, and sends nothing off the loopback
    (its endpoint comes with each call: `driver_services.py`)."""
    with EchoProvider(answer_check=False, statuses=(400,)) as provider:
        proxy = _Proxy()

        async def ask(origin: str, method: str, path: str) -> int:
            try:
                status, _, _ = await proxy.remote(origin, method, path, [], b"{}")
                return status
            finally:
                await proxy._session.close()
                proxy._session = None

        away = provider.base_url.replace("127.0.0.1", "192.0.2.1")  # TEST-NET-1
        statuses = {
            "loopback": asyncio.run(ask(provider.base_url, "POST", "/v1/chat/completions")),
            "off the loopback": asyncio.run(ask(away, "POST", "/v1/chat/completions")),
            "another prefix": asyncio.run(ask(provider.base_url, "POST", "/admin/keys")),
            "method": asyncio.run(ask(provider.base_url, "DELETE", "/v1/files/f1")),
        }
        assert statuses == {
            "loopback": 400, "off the loopback": 403, "another prefix": 403, "method": 403,
        }  # fmt: skip
        assert [path for _, path, _ in provider.requests] == ["/v1/chat/completions"]
