"""The trajectory viewer of report.html on a real offline run, opened in headless Chromium."""

from pathlib import Path
from urllib.parse import quote

import orjson
from chromium_page import dump_dom, needs_chromium

from piserini_ray.config import RunConfig
from piserini_ray.store import RunStore

QUERIES = 12  # the `finished_run` fixture's


def _query_file(run_dir: Path, name: str) -> dict:
    text = (run_dir / "viewer" / "q" / name).read_text()
    assert text.startswith("window.piseriniQuery(") and text.endswith(");\n")
    return orjson.loads(text[len("window.piseriniQuery(") : -3])


@needs_chromium
def test_the_viewer_lists_every_query_and_opens_a_trajectory(
    tmp_path: Path, finished_run: tuple[Path, RunConfig]
) -> None:
    run_dir, config = finished_run
    with RunStore(run_dir, config) as store:
        records = store.records(rankings=True)
    rows = orjson.loads(
        (run_dir / "viewer" / "index.js").read_text().removeprefix("window.piseriniRows = ")[:-2]
    )
    assert sorted(r["id"] for r in rows) == sorted(r.query_id for r in records)
    assert len(rows) == QUERIES

    # The files: each query's turns, and its spill files linked where they are.
    record = max(records, key=lambda r: len(r.trajectory))
    data = _query_file(run_dir, next(r["file"] for r in rows if r["id"] == record.query_id))
    assert len(data["turns"]) == len(record.trajectory)
    hrefs = [c["spill_href"] for t in data["turns"] for c in t["tool_calls"] if "spill_href" in c]
    assert hrefs and all((run_dir / h).is_file() for h in hrefs)
    first_call = data["turns"][0]["tool_calls"][0]
    assert isinstance(first_call["arguments"], dict)  # parsed, not a JSON string
    docs = {d["docid"]: d for d in data["documents"]}
    assert docs and all(len(d["ranks"]) == len(record.rankings) for d in docs.values())
    for docid, doc in docs.items():
        assert ("surfaced" in doc["tiers"]) == (docid in record.surfaced)
        seen = [r.docids.index(docid) + 1 if docid in r.docids else None for r in record.rankings]
        assert doc["ranks"] == seen

    # The page: one row per query; the address opens a query and shows its turns.
    page = (run_dir / "report.html").as_uri()
    dom = dump_dom(page, tmp_path / "profile")
    assert dom.count("<tr data-query=") == QUERIES and f"{QUERIES} of {QUERIES}" in dom
    dom = dump_dom(f"{page}#q={quote(record.query_id)}", tmp_path / "profile")
    assert f'data-query="{record.query_id}" data-turns="{len(record.trajectory)}"' in dom
    assert dom.count('class="turn"') == len(record.trajectory)
    assert dom.count('class="tool-call"') == sum(len(t.tool_calls) for t in record.trajectory)
    assert dom.count('class="documents"') == 1
    # Filtering keeps only matching rows.
    dom = dump_dom(f"{page}#filter={quote(record.query_id)}", tmp_path / "profile")
    assert dom.count("<tr data-query=") == 1
