import re
from pathlib import Path

import pytest
from conftest import EDGE_DOCS, LUCENE_SPECIALS, assert_golden

from piserini_ray.config import ToolsConfig
from piserini_ray.retrieval import BM25Searcher
from piserini_ray.tools import BLOCKED_MESSAGE, TOOL_NAMES, ToolSession, tool_schemas
from piserini_ray.tools.excerpt import excerpt, query_tokens, token_pattern
from piserini_ray.tools.spill import safe_component

QUERY = "Journal of Psychotherapy Integration publisher"


def _search(session: ToolSession, query: str = QUERY):
    return session.call("search", {"reason": "look", "query": query})


def _browse(session: ToolSession, search_id: str = "s1", **kw):
    return session.call("read_search_results", {"reason": "browse", "search_id": search_id, **kw})


def _read(session: ToolSession, docid: str, **kw):
    return session.call("read_document", {"reason": "read", "docid": docid, **kw})


# ---------------------------------------------------------------- golden outputs


def test_golden_outputs(searcher: BM25Searcher, tmp_path: Path) -> None:
    session = ToolSession(searcher, spill_dir=tmp_path)
    assert_golden("search.txt", _search(session).output)
    assert_golden("read_search_results.txt", _browse(session).output)
    assert_golden("read_search_results_deep.txt", _browse(session, offset=48, limit=5).output)
    assert_golden("read_document.txt", _read(session, "msq-7976b1e35e0a").output)


def test_search_layout(searcher: BM25Searcher) -> None:
    session = ToolSession(searcher)
    result = _search(session)
    assert result.ok and result.reason == "look"
    ranks = re.findall(r"^\[(\d+)\] docid: (\S+) \| score: (\d+\.\d{4})$", result.output, re.M)
    assert [int(r) for r, _, _ in ranks] == [1, 2, 3, 4, 5]
    ranking = searcher.search(QUERY)
    assert [d for _, d, _ in ranks] == [searcher.docid(int(o)) for o in ranking.ordinals[:5]]
    assert f"{len(ranking)} hits cached" in result.output
    assert "read_search_results(search_id='s1', offset=6, limit=10)" in result.output


# ---------------------------------------------------------------- paging at the edges


def test_browse_edges(searcher: BM25Searcher) -> None:
    session = ToolSession(searcher)
    _search(session)
    total = len(searcher.search(QUERY))
    last = _browse(session, offset=total)
    assert last.ok and f"ranks {total}-{total} of {total}" in last.output
    assert f"[end of search s1: all {total} hits shown]" in last.output
    exact = _browse(session, offset=total - 9, limit=10)
    assert "More:" not in exact.output and "[end of search s1" in exact.output
    one_short = _browse(session, offset=total - 10, limit=10)
    assert f"offset={total}, limit=10) shows the next hits (1 remain)" in one_short.output
    past = _browse(session, offset=total + 1)
    assert not past.ok and f"search s1 has {total} hits (valid offsets 1-{total})" in past.output
    beyond = _browse(session, offset=total - 2, limit=50)
    assert beyond.ok and f"ranks {total - 2}-{total} of {total}" in beyond.output


def test_read_document_edges(edge_searcher: BM25Searcher) -> None:
    session = ToolSession(edge_searcher)
    first = _read(session, "long-doc")
    assert "lines 1-200 of 5000" in first.output
    assert first.output.splitlines()[2] == "A long document"
    assert (
        "read_document(docid='long-doc', offset=201, limit=200) continues (4800 lines remain)"
        in first.output
    )
    end = _read(session, "long-doc", offset=4801, limit=200)
    assert "lines 4801-5000 of 5000" in end.output and "[end of document]" in end.output
    tail = _read(session, "long-doc", offset=5000)
    assert "lines 5000-5000 of 5000" in tail.output and "line 5000 of the long" in tail.output
    past = _read(session, "long-doc", offset=5001)
    assert not past.ok and "document long-doc has 5000 lines (valid offsets 1-5000)" in past.output


def test_lines_split_on_any_line_break(edge_searcher: BM25Searcher) -> None:
    out = _read(ToolSession(edge_searcher), "mixed-breaks").output
    assert "lines 1-5 of 5" in out
    assert out.splitlines()[2:7] == ["one", "two", "three", "four", "five"]


# ---------------------------------------------------------------- cache


def test_eviction_after_the_33rd_search(searcher: BM25Searcher) -> None:
    session = ToolSession(searcher)
    for i in range(33):
        assert _search(session, f"journal {i}").ok
    evicted = _browse(session, "s1")
    assert not evicted.ok and "'s1' was evicted" in evicted.output
    assert "Live search ids: s2, s3" in evicted.output and "s33" in evicted.output
    assert _browse(session, "s2").ok and _browse(session, "s33").ok
    unknown = _browse(session, "s34")
    assert not unknown.ok and "'s34' is unknown" in unknown.output


def test_cache_size_is_configurable(searcher: BM25Searcher) -> None:
    session = ToolSession(searcher, ToolsConfig(cache_size=2))
    for q in ("a journal", "b journal", "c journal"):
        _search(session, q)
    assert not _browse(session, "s1").ok and _browse(session, "s2").ok


def test_every_lucene_special_character_through_the_tool(searcher: BM25Searcher) -> None:
    session = ToolSession(searcher)
    for text in LUCENE_SPECIALS:
        result = _search(session, text)
        assert result.ok, (text, result.output)


def test_zero_hits_still_get_an_id(searcher: BM25Searcher) -> None:
    session = ToolSession(searcher)
    result = _search(session, "?!")
    assert result.ok and "Search s1 for '?!': no document matched" in result.output
    assert not _browse(session, "s1").ok
    assert _search(session).output.startswith("Search s2 ")


# ---------------------------------------------------------------- document sets


def test_document_sets(searcher: BM25Searcher) -> None:
    session = ToolSession(searcher)
    _search(session)
    ranking = [searcher.docid(int(o)) for o in searcher.search(QUERY).ordinals]
    assert list(session.surfaced) == ranking  # every cached hit, not only the shown ones
    assert list(session.previewed) == ranking[:5]
    _browse(session, offset=6, limit=10)
    assert list(session.previewed) == ranking[:15]
    _browse(session, offset=3, limit=5)  # re-showing adds nothing twice
    assert list(session.previewed) == ranking[:15]
    assert session.opened == {}
    _read(session, ranking[40])
    _read(session, "msq-9cfceedc64a0")  # opened without being surfaced first is still opened
    assert list(session.opened) == [ranking[40], "msq-9cfceedc64a0"]
    _search(session, "Stanley Hall")
    assert set(ranking) < set(session.surfaced)


# ---------------------------------------------------------------- blocked


def test_blocked_tools_return_a_clear_error(searcher: BM25Searcher) -> None:
    session = ToolSession(searcher)
    _search(session)
    before = (dict(session.surfaced), dict(session.previewed), dict(session.opened))
    session.block()
    for result in (_search(session), _browse(session), _read(session, "msq-9cfceedc64a0")):
        assert not result.ok and result.error == BLOCKED_MESSAGE
        assert result.output.startswith("Error: Tools are blocked")
    assert (session.surfaced, session.previewed, session.opened) == before


# ---------------------------------------------------------------- bad arguments


BAD_CALLS = [
    ("search", {"query": "x"}, "search: missing reason"),
    ("search", {"reason": "  ", "query": "x"}, "reason must be a short rationale"),
    ("search", {"reason": 5, "query": "x"}, "reason must be a string, got int"),
    ("search", {"reason": "r"}, "search: missing query. It takes: reason, query."),
    ("search", {"reason": "r", "query": ["x"]}, "query must be a string, got list"),
    ("search", {"reason": "r", "query": "x", "k": 3}, "unknown argument(s) k"),
    ("read_search_results", {"reason": "r", "search_id": "s7"}, "'s7' is unknown"),
    ("read_search_results", {"reason": "r", "search_id": 1}, "search_id must be a string"),
    (
        "read_search_results",
        {"reason": "r", "search_id": "s1", "offset": 0},
        "offset must be at least 1, got 0",
    ),
    (
        "read_search_results",
        {"reason": "r", "search_id": "s1", "limit": 0},
        "limit must be at least 1, got 0",
    ),
    (
        "read_search_results",
        {"reason": "r", "search_id": "s1", "limit": 10**9},
        "limit must be at most 1000",
    ),
    (
        "read_search_results",
        {"reason": "r", "search_id": "s1", "offset": "6"},
        "offset must be an integer, got '6'",
    ),
    (
        "read_search_results",
        {"reason": "r", "search_id": "s1", "offset": True},
        "offset must be an integer, got True",
    ),
    (
        "read_search_results",
        {"reason": "r", "search_id": "s1", "offset": 6.5},
        "offset must be an integer, got 6.5",
    ),
    ("read_document", {"reason": "r"}, "read_document: missing docid"),
    ("read_document", {"reason": "r", "docid": "nope"}, "unknown docid 'nope'"),
    (
        "read_document",
        {"reason": "r", "docid": "msq-9cfceedc64a0", "offset": -3},
        "offset must be at least 1",
    ),
    (
        "read_document",
        {"reason": "r", "docid": "msq-9cfceedc64a0", "limit": 10**6},
        "limit must be at most 10000",
    ),
    ("read_document", "{not json", "the arguments are not valid JSON"),
    ("read_document", "[1, 2]", "the arguments must be a JSON object, not list"),
    ("read_document", None, "read_document: missing reason, docid"),
    (
        "open_page",
        {"reason": "r"},
        "Unknown tool 'open_page'. The tools are: search, read_search_results, read_document.",
    ),
]


@pytest.mark.parametrize(("tool", "args", "message"), BAD_CALLS)
def test_bad_arguments_become_error_observations(
    searcher: BM25Searcher, tool: str, args: object, message: str
) -> None:
    session = ToolSession(searcher)
    _search(session)
    result = session.call(tool, args)  # type: ignore[arg-type]
    assert not result.ok
    assert message in result.output, result.output
    assert result.output == f"Error: {result.error}"


def test_integral_floats_and_json_strings_are_accepted(searcher: BM25Searcher) -> None:
    session = ToolSession(searcher)
    _search(session)
    result = session.call(
        "read_search_results", '{"reason": "r", "search_id": " s1 ", "offset": 6.0, "limit": 2}'
    )
    assert result.ok and "ranks 6-7 of" in result.output


def test_long_reasons_are_recorded_clipped(searcher: BM25Searcher) -> None:
    session = ToolSession(searcher)
    result = session.call("search", {"reason": "word " * 150, "query": "journal"})
    assert result.ok and result.reason is not None
    assert len(result.reason.split()) == 101 and result.reason.endswith("…")


# ---------------------------------------------------------------- excerpts


def test_excerpts_only_for_the_top_50(searcher: BM25Searcher) -> None:
    session = ToolSession(searcher)
    _search(session)
    page = _browse(session, offset=49, limit=4).output
    blocks = re.split(r"\n(?=\[\d+\])", page)
    by_rank = {int(re.match(r"\[(\d+)\]", b).group(1)): b for b in blocks if b.startswith("[")}
    assert "excerpt:" in by_rank[49] and "excerpt:" in by_rank[50]
    assert "no excerpt below rank 50" in by_rank[51] and "excerpt:" not in by_rank[52]


def test_excerpt_window() -> None:
    assert query_tokens("The Journal of A.B.C's X-ray, a+b!") == [
        "journal",
        "a.b.c",
        "x-ray",
        "a+b",
    ]
    text = "x" * 100 + " Journal here " + "y" * 400
    got = excerpt(text, token_pattern(["journal"]), width=220, lead=55)
    assert got.startswith("…" + "x" * 54 + " Journal") and got.endswith("…")
    assert len(got) == 222  # 220 characters plus the two ellipses
    assert excerpt("short text", token_pattern(["absent"])) == "short text"
    assert excerpt("journalism journal", token_pattern(["journal"]), lead=0) == "…journal"
    assert excerpt("a\n\n b", None) == "a b"


# ---------------------------------------------------------------- spill files


def test_spill_on_a_long_document(edge_searcher: BM25Searcher, tmp_path: Path) -> None:
    session = ToolSession(edge_searcher, spill_dir=tmp_path)
    result = _read(session, "long-doc", limit=5000)
    assert result.ok and result.spill_file is not None
    shown = result.output.splitlines()
    assert (
        len(shown) <= 2000 + 2 and "[output truncated to 2000 lines / 50000 bytes" in result.output
    )
    assert len(result.output.encode()) <= 50_000 + 300
    full = (tmp_path / result.spill_file).read_text()
    assert "lines 1-5000 of 5000" in full and "line 5000 of the long document" in full
    assert result.spill_file == "0001-read_document-long-doc-lines-1-5000.txt"


def test_spill_on_a_deep_page(searcher: BM25Searcher, tmp_path: Path) -> None:
    session = ToolSession(searcher, spill_dir=tmp_path)
    _search(session, "first american city state world year war born")
    result = _browse(session, offset=1, limit=1000)
    assert result.spill_file == "0001-read_search_results-s1-ranks-1-1000.txt"
    assert "[1000]" in (tmp_path / result.spill_file).read_text()
    assert "[1000]" not in result.output
    # The full text also stays with the session, for the record (the run store writes it).
    assert session.spills[result.spill_file] == (tmp_path / result.spill_file).read_text()


def test_spill_names_cannot_escape(edge_searcher: BM25Searcher, tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    # A two-line cap makes every output spill, so each hostile docid names a spill file.
    session = ToolSession(edge_searcher, ToolsConfig(spill_max_lines=2), spill_dir=spill)
    names = []
    for doc in EDGE_DOCS:
        result = _read(session, doc["docid"])
        assert result.ok and result.spill_file, result.output
        names.append(result.spill_file)
        assert (spill / result.spill_file).resolve().parent == spill.resolve()
    assert len(set(names)) == len(EDGE_DOCS)
    assert all("/" not in n and "\\" not in n and not n.startswith(".") for n in names)
    assert sorted(p.name for p in spill.iterdir()) == sorted(names)
    assert list(tmp_path.iterdir()) == [spill]  # nothing landed beside the spill folder
    assert safe_component("..") != safe_component("_") and safe_component("s1") == "s1"


def test_a_failure_inside_a_tool_is_an_observation_not_a_crash(
    searcher: BM25Searcher, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A spill folder that cannot be written (here: a file in its way) is our failure, not
    the model's: the agent sees an error it can act on, the log gets the details."""
    (tmp_path / "spill").write_text("a file where the folder should be")
    session = ToolSession(searcher, spill_dir=tmp_path / "spill")
    assert _search(session, "first american city state world year war born").ok
    with caplog.at_level("WARNING"):
        result = _browse(session, offset=1, limit=1000)  # long enough to spill
    assert not result.ok and "the read_search_results tool failed internally" in result.output
    assert "read_search_results failed inside the tool" in caplog.text
    assert _browse(session, offset=6, limit=5).ok  # the session goes on


# ---------------------------------------------------------------- schemas


def test_schemas_name_the_three_tools_with_reason_first() -> None:
    schemas = tool_schemas()
    assert [s["function"]["name"] for s in schemas] == list(TOOL_NAMES)
    for schema in schemas:
        params = schema["function"]["parameters"]
        assert next(iter(params["properties"])) == "reason"
        assert params["required"][0] == "reason"
        assert params["additionalProperties"] is False
