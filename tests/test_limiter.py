"""The limiter's rules on a fake clock (the cluster-wide behaviour is in test_runtime.py)."""

from piserini_ray.config import RateLimitConfig
from piserini_ray.llm.limiter import RateLimiter, new_ticket


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


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
    limiter = RateLimiter(RateLimitConfig(tokens_per_minute=1000, window_margin=0), clock)
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
    limiter = RateLimiter(RateLimitConfig(tokens_per_minute=1000, window_margin=0), clock)
    assert limiter.try_acquire(900, "a")[0]
    assert not limiter.try_acquire(200, "b")[0]
    limiter.release("a", tokens=300)  # the estimate was three times too high
    assert limiter.try_acquire(600, "b")[0]
    limiter.release("b", tokens=700)  # and this one too low: the window is now full
    assert not limiter.try_acquire(1, "c")[0]
    limiter.release("c")  # a call that reports no usage keeps its estimate


def test_reservations_learn_how_far_off_the_estimates_are() -> None:
    """Callers guess ~4 characters a token; when the provider keeps counting twice that, the
    limiter learns it, so the calls in flight cannot overfill a token quota."""
    clock = Clock()
    limiter = RateLimiter(RateLimitConfig(tokens_per_minute=10_000, window_margin=0), clock)
    for i in range(60):
        assert limiter.try_acquire(100, f"t{i}")[0]
        limiter.release(f"t{i}", tokens=200)
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
