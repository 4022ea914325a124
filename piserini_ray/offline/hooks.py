"""The offline provider's extension point: what may be added to its request pipeline
(`server.py`) from outside the product.

The product's `Interceptor` adds nothing: a rehearsal's provider answers every request its
policy's way, within its quotas and latency. The test kit (`piserini_ray_testkit`) subclasses it
to inject faults (seeded rates and scripted one-shot failures), hold requests until released
and draw batch fates, without any of it living in a run's provider.

Per request, `Interceptor.ticket` is asked after the parse, before quota admission; the ticket
it returns is asked at the later stages. Every method may raise a `codec.Problem`, which the
route's codec renders in its provider's error format.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from piserini_ray.offline.batch_emulator import Fate
from piserini_ray.offline.codec import Codec, Parsed
from piserini_ray.offline.policy import PolicyReply

if TYPE_CHECKING:
    from piserini_ray.offline.bill import RecordedRequest

__all__ = ["Interceptor", "Ticket"]


class Ticket:
    """One request's part in the interceptor; this one changes nothing."""

    #: Answered outside the quota windows: neither admitted by them nor counted in them.
    bypasses_quota = False

    async def delay(self, record: RecordedRequest) -> None:
        """Stage 4, before the configured latency: wait (a hang), or not."""

    async def fault(self, record: RecordedRequest) -> None:
        """Stage 5, after the latency: raise a `Problem` to fail the request, or wait."""

    def damage(
        self, reply: PolicyReply, shown: Mapping[str, Any], record: RecordedRequest
    ) -> PolicyReply:
        """Stage 6: the policy's reply as it goes out (`shown`: the request the policy saw)."""
        return reply

    def encoded(self, codec: Codec, body: dict[str, Any]) -> None:
        """Stage 7: the encoded body (in place), just before it is sent."""


#: The ticket of a request nobody intercepts.
PLAIN = Ticket()


class Interceptor:
    """Adds nothing to the pipeline: the product's."""

    async def gate(self) -> None:
        """Before the pipeline: a request may wait here (unparsed, unbilled)."""

    def ticket(self, parsed: Parsed, record: RecordedRequest) -> Ticket:
        """The request's ticket, after the parse (may raise a `Problem`: answered at once)."""
        return PLAIN

    def batch_fates(self, n: int) -> list[Fate]:
        """The fates of a new batch's `n` requests: every one runs."""
        return ["run"] * n

    def reset(self) -> None:
        """Forget every state (the provider's `reset`)."""
