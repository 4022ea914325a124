"""The limiter's rules on a fake clock (the cluster-wide behaviour is in tests/engines/ray/)."""

import random

import pytest

from piserini_ray.config import RateLimitConfig
from piserini_ray.errors import ConfigError, RequestTooLarge
from piserini_ray.llm.failures import Failure, FailureKind
from piserini_ray.llm.limiter import RateLimiter, check_quotas, new_ticket, outcome_of


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _prompt_only(**quota: int) -> RateLimitConfig:
    """A token quota whose reservations are the prompt estimates alone (no completion guess, no
    margin), so the arithmetic below is the window's own."""
    return RateLimitConfig(**quota, window_margin=0, output_tokens_guess=0, estimate_margin=0)


def test_requests_per_window_count_until_a_window_after_return() -> None:
    clock = Clock()
    limiter = RateLimiter(RateLimitConfig(requests_per_minute=2, window_margin=0), clock)
    assert limiter.try_acquire(0, "a") == (True, 0.0)
    assert limiter.try_acquire(0, "b") == (True, 0.0)
    granted, wait = limiter.try_acquire(0, "c")
    assert not granted and wait == 0.05  # both still in flight: nothing to wait out yet
    clock.t += 5
    limiter.release("a")
    limiter.release("b")
    granted, wait = limiter.try_acquire(0, "c")
    assert not granted and wait == 60.0  # a returned at t+5: it counts until t+65
    assert limiter.stats().waiting == 1
    clock.t += 60
    assert limiter.try_acquire(0, "c")[0] and limiter.stats().waiting == 0


def test_a_release_that_arrives_after_the_next_acquire_still_counts_both() -> None:
    """Ray does not order an async actor's calls: one query's next `acquire` can be handled
    before the `release` of its previous call. Each grant has its own ticket, so both calls
    count against the quota (keyed by caller, the second grant overwrote the first and the
    provider later answered 429s)."""
    clock = Clock()
    limiter = RateLimiter(RateLimitConfig(requests_per_minute=2, window_margin=0), clock)
    first, second = new_ticket(), new_ticket()
    assert first != second
    assert limiter.try_acquire(0, first)[0]
    assert limiter.try_acquire(0, second)[0]  # the same query's next call, release not yet in
    limiter.release(first)
    assert not limiter.try_acquire(0, new_ticket())[0]  # two calls in the window, not one
    assert limiter.stats().in_flight == 1


def test_tokens_per_window() -> None:
    clock = Clock()
    limiter = RateLimiter(_prompt_only(tokens_per_minute=1000), clock)
    assert limiter.try_acquire(600, "a")[0]
    assert not limiter.try_acquire(600, "b")[0]
    assert limiter.try_acquire(400, "c")[0]
    limiter.release("a")
    limiter.release("c")
    clock.t += 60
    assert limiter.try_acquire(600, "b")[0]


def test_token_window_holds_what_calls_really_used() -> None:
    """A grant reserves the estimate; the release puts the provider's count in its place, so
    an estimate that was too high frees the quota and one that was too low fills it."""
    clock = Clock()
    limiter = RateLimiter(_prompt_only(tokens_per_minute=1000), clock)
    assert limiter.try_acquire(900, "a")[0]
    assert not limiter.try_acquire(200, "b")[0]
    limiter.release("a", prompt_tokens=300, output_tokens=0)  # the estimate was 3x too high
    assert limiter.try_acquire(600, "b")[0]
    limiter.release(
        "b", prompt_tokens=700, output_tokens=0
    )  # and this one too low: the window is now full
    assert not limiter.try_acquire(1, "c")[0]
    limiter.release("c")  # a call that reports no usage keeps its estimate


def test_reservations_learn_how_far_off_the_estimates_are() -> None:
    """Callers guess ~4 characters a token; when the provider keeps counting twice that, the
    limiter learns it, so the calls in flight cannot overfill a token quota."""
    clock = Clock()
    limiter = RateLimiter(_prompt_only(tokens_per_minute=10_000), clock)
    for i in range(60):
        assert limiter.try_acquire(100, f"t{i}")[0]
        limiter.release(f"t{i}", prompt_tokens=200, output_tokens=0)
        clock.t += 61  # keep the window empty
    assert abs(limiter.token_scale - 2.0) < 0.01
    assert limiter.try_acquire(3_000, "big")[0]
    assert not limiter.try_acquire(2_100, "next")[0]  # ~6,000 reserved + ~4,200 > 10,000
    assert limiter.try_acquire(1_900, "next")[0]


def test_aimd_concurrency_and_cooldown() -> None:
    clock = Clock()
    config = RateLimitConfig(initial_concurrency=8, clean_period=10, decrease_factor=0.5)
    limiter = RateLimiter(config, clock)
    for i in range(8):
        assert limiter.try_acquire(0, f"c{i}")[0]
    assert not limiter.try_acquire(0, "c8")[0]  # the concurrency limit binds
    limiter.release("c0", "rate_limit", retry_after=3.0)
    assert limiter.limit == 4.0
    granted, wait = limiter.try_acquire(0, "c8")
    assert not granted and wait == 3.0  # everyone holds for the provider's Retry-After
    for i in range(1, 8):
        limiter.release(f"c{i}")
    clock.t += 3
    assert limiter.try_acquire(0, "c8")[0]
    clock.t += 10
    limiter.try_acquire(0, "c9")
    assert limiter.limit == 5.0  # one more after a clean period
    limiter.release("c8", "rate_limit")
    assert limiter.limit == 1.0  # half of the 2 calls in flight, not half of the nominal 5
    limiter.release("c9", "rate_limit")
    assert limiter.limit == 1.0  # never below min_concurrency
    assert limiter.stats().rate_limited == 3


def test_concurrency_starts_open_and_a_429_cuts_from_what_was_sent() -> None:
    """By default nothing is held back until the provider pushes back; then the limit drops
    relative to the calls actually in flight (a cut from a nominal 256 would not bite)."""
    clock = Clock()
    limiter = RateLimiter(RateLimitConfig(), clock)
    assert limiter.limit == 256.0
    for i in range(40):
        assert limiter.try_acquire(0, f"c{i}")[0]
    limiter.release("c0", "rate_limit")
    assert limiter.limit == 20.0
    assert not limiter.try_acquire(0, "late")[0]  # 39 still in flight, over the new limit


def test_a_reservation_holds_the_completion_too() -> None:
    """Prompt + `max_output_tokens` when the model bounds its output, else the mean the
    provider has been reporting (a guess until the first reply)."""
    clock = Clock()
    config = RateLimitConfig(
        tokens_per_minute=1000, window_margin=0, output_tokens_guess=300, estimate_margin=0
    )
    limiter = RateLimiter(config, clock)
    assert limiter.reservation(400) == 700
    assert limiter.reservation(400, max_output=100) == 500
    margin = RateLimiter(config.model_copy(update={"estimate_margin": 0.1}), clock)
    assert margin.reservation(400, max_output=100) == 540  # learned parts only: 440 + 100
    assert margin.reservation(400) == 770
    assert limiter.try_acquire(400, "a")[0]
    assert not limiter.try_acquire(400, "b")[0]  # 700 + 700 > 1000, though prompts fit
    limiter.release("a", prompt_tokens=400, output_tokens=50)
    assert limiter.output_mean == pytest.approx(300 + 0.1 * (50 - 300))


def test_a_call_that_can_never_fit_is_refused_even_in_an_empty_window() -> None:
    limiter = RateLimiter(RateLimitConfig(tokens_per_minute=1000, estimate_margin=0), Clock())
    with pytest.raises(
        RequestTooLarge, match=r"reserves 1,700 tokens .*tokens_per_minute is 1,000"
    ):
        limiter.try_acquire(1200, "huge")
    assert limiter.stats().waiting == 0 and limiter.stats().in_flight == 0


def _granted_per_window(seed: int, restart_at: int | None) -> list[tuple[float, int]]:
    """Random callers against a token quota on a fake clock: the (grant time, reservation or
    real count) of every call, as a provider would count it."""
    rng = random.Random(seed)
    clock = Clock()
    config = RateLimitConfig(
        tokens_per_minute=5000, requests_per_minute=40, window_margin=0.5, output_tokens_guess=200
    )
    limiter = RateLimiter(config, clock)
    open_calls: dict[str, tuple[int, int, int]] = {}
    counted: list[tuple[float, int]] = []
    for step in range(1500):
        clock.t += rng.uniform(0, 0.8)
        if restart_at is not None and step == restart_at:  # the actor restarts: memory lost
            limiter = RateLimiter(config, clock)
            limiter.assume_window_full()
        if open_calls and rng.random() < 0.5:
            ticket = rng.choice(sorted(open_calls))
            prompt, output, index = open_calls.pop(ticket)
            limiter.release(ticket, prompt_tokens=prompt, output_tokens=output)
            counted[index] = (counted[index][0], prompt + output)  # what the provider counted
        prompt_estimate = rng.randint(10, 1500)
        max_output = rng.choice([100, 400])
        ticket = new_ticket()
        if limiter.try_acquire(prompt_estimate, ticket, max_output)[0]:
            reserved = limiter.reservation(prompt_estimate, max_output)
            # What the call really uses: at most what it reserved (a completion within
            # max_output_tokens, a prompt within the learned estimate).
            output = rng.randint(0, max_output)
            prompt = int((reserved - max_output) * rng.uniform(0.5, 1.0))
            open_calls[ticket] = (prompt, output, len(counted))
            counted.append((clock.t, reserved))
    return counted


@pytest.mark.parametrize("restart_at", [None, 700])
@pytest.mark.parametrize("seed", range(8))
def test_no_window_ever_holds_more_than_the_quota(seed: int, restart_at: int | None) -> None:
    """Property: over any window, the tokens granted (prompt + completion, as reserved or as
    counted) never exceed the quota, nor the requests theirs, also across a restart, as long
    as a call uses no more than it reserved (`max_output_tokens` bounds the completion; with
    a learned mean instead, the window holds on average, not for every call)."""
    counted = _granted_per_window(seed, restart_at)
    assert len(counted) > 50  # the quota was exercised, not starved
    for start, _ in counted:
        window = [tokens for t, tokens in counted if start <= t < start + 60]
        assert sum(window) <= 5000, (seed, start)
        assert len(window) <= 40, (seed, start)


def test_a_restarted_limiter_admits_nothing_for_one_window() -> None:
    clock = Clock()
    limiter = RateLimiter(RateLimitConfig(requests_per_minute=10, window_margin=1), clock)
    limiter.assume_window_full()
    granted, wait = limiter.try_acquire(0, "a")
    assert not granted and wait == 61.0
    clock.t += 61
    assert limiter.try_acquire(0, "a")[0]
    unlimited = RateLimiter(RateLimitConfig(), clock)  # no quota: nothing to protect
    unlimited.assume_window_full()
    assert unlimited.try_acquire(0, "b")[0]


def test_a_429_naming_a_per_minute_quota_sets_a_cooldown_not_a_cut() -> None:
    clock = Clock()
    limiter = RateLimiter(RateLimitConfig(initial_concurrency=8), clock)
    for i in range(4):
        assert limiter.try_acquire(0, f"c{i}")[0]
    quota = Failure(
        FailureKind.RATE_LIMIT,
        "RateLimitError: Rate limit reached for tokens per min (TPM): Limit 30000",
        retry_after=2.0,
        quota_window="tokens",
    )
    assert outcome_of(quota) == ("quota", 2.0)
    limiter.release("c0", *outcome_of(quota))
    assert limiter.limit == 8.0  # the concurrency limit is left alone
    granted, wait = limiter.try_acquire(0, "c4")
    assert not granted and wait == 2.0  # but everyone holds for the window
    burst = Failure(FailureKind.RATE_LIMIT, "RateLimitError: Too many concurrent requests")
    assert outcome_of(burst) == ("rate_limit", None)
    limiter.release("c1", *outcome_of(burst))
    assert limiter.limit == 1.5  # half of the 3 in flight


def test_conflicting_quotas_for_one_key_are_a_config_error() -> None:
    from piserini_ray.config import load_config

    def run(rpm: int, **more: object):
        return load_config(
            None, {"model.name": "gpt-5", "model.rate_limit.requests_per_minute": rpm} | more
        )

    a = run(100)
    check_quotas([a, run(100, **{"agent.budget_seconds": 60})])  # agreeing runs share one
    with pytest.raises(ConfigError, match=r"share a quota \(OPENAI_API_KEY\|gpt-5\) but set"):
        check_quotas([a, run(50, **{"agent.budget_seconds": 60})])
    check_quotas([a, run(50, **{"model.api_key_env": "OTHER_KEY"})])  # another key, own quota
    # The route's own variable named in api_key_env is the same key: the same quota.
    with pytest.raises(ConfigError, match=r"share a quota \(OPENAI_API_KEY\|gpt-5\) but set"):
        check_quotas([a, run(50, **{"model.api_key_env": "OPENAI_API_KEY"})])
