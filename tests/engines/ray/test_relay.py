"""A replica's relay admits only its own client: its secret (made in the replica, never sent),
the endpoint's own path prefix and methods, bodies up to `MAX_BODY`. The relay and the driver's
side (`forward`, what `driver_services.DriverServices.forward` runs) run here as they are,
without Ray (the actor's handle is awaited in the relay's loop), over real HTTP, in front of a
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "llm"))
from echo_provider import EchoProvider

from piserini_ray.engines.ray.relay import MAX_BODY, Relay, admitted_path, forward, relayed


class _Proxy:
    """What a Ray handle of the driver's actor gives the relay: `proxy.forward.remote(...)`,
    awaited, here `relay.forward` with a session of its own."""

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
    """(the provider behind, the relay's URL, its secret)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    with EchoProvider(answer_check=False, statuses=(400,)) as provider:
        proxy = _Proxy()
        relay = Relay(provider.base_url, lambda: proxy)
        url = asyncio.run_coroutine_threadsafe(relay.url(), loop).result(30)
        assert asyncio.run_coroutine_threadsafe(relay.url(), loop).result(30) == url  # once
        secret = url.removeprefix("http://127.0.0.1:").split("/")[1]
        yield provider, url, secret
        asyncio.run_coroutine_threadsafe(relay.close(), loop).result(30)
        if proxy._session is not None:
            asyncio.run_coroutine_threadsafe(proxy._session.close(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_the_replicas_client_gets_through_with_the_secret_stripped(served) -> None:
    provider, url, secret = served
    assert len(secret) >= 32 and url.endswith(f"/{secret}/v1")
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


def test_each_relay_has_a_secret_of_its_own_and_the_driver_none() -> None:
    """The secret is made where it is checked: two replicas' relays differ, and the driver
    hands out only the endpoint and whether to relay it."""
    loop = asyncio.new_event_loop()
    try:
        relays = [Relay("http://127.0.0.1:9/v1", _Proxy) for _ in range(2)]
        urls = [loop.run_until_complete(r.url()) for r in relays]
        secrets_seen = {u.split("/")[3] for u in urls}
        assert len(secrets_seen) == 2 and all(len(x) >= 32 for x in secrets_seen)
        for relay in relays:
            loop.run_until_complete(relay.close())
    finally:
        loop.close()
    assert relayed("http://127.0.0.1:9/v1", "node-b", driver_node="node-a")
    assert not relayed("http://127.0.0.1:9/v1", "node-a", driver_node="node-a")
    assert not relayed("https://api.openai.com/v1", "node-b", driver_node="node-a")
    assert not relayed(None, "node-b", driver_node="node-a")


def test_a_relay_whose_driver_is_gone_answers_502_and_serves_on() -> None:
    """A driver's node (or its actor) that cannot be found is a 502, as a proxy answers: the
    client's retries handle it; the relay looks the actor up again at the next request."""
    looked_up: list[int] = []

    def gone() -> Any:
        looked_up.append(1)
        raise ValueError("Failed to look up actor with name 'piserini-driver:01'")

    async def ask_twice() -> list[int]:
        relay = Relay("http://127.0.0.1:9/v1", gone)
        url = await relay.url()
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                replies = [await client.post(f"{url}/chat/completions", json={}) for _ in "ab"]
        finally:
            await relay.close()
        assert all("the driver's endpoint is gone" in r.text for r in replies)
        return [r.status_code for r in replies]

    assert asyncio.run(ask_twice()) == [502, 502]
    assert len(looked_up) == 2


@pytest.mark.parametrize(
    ("path", "ok"),
    [("/v1/chat/completions", True), ("/v1", True), ("/v1x/chat", False), ("/v2/a", False),
     ("/v1/../admin", False), ("/v1//x", False), ("/v1/./x", False), ("/v1/x/", False)],
)  # fmt: skip
def test_only_the_endpoints_own_prefix(path: str, ok: bool) -> None:
    assert admitted_path(path, "/v1") is ok


def test_the_proxy_reaches_only_a_loopback_endpoint_and_its_own_paths() -> None:
    """The driver's side holds to the relay's rules too, and sends nothing off the loopback
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
