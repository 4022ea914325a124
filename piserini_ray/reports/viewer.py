"""The trajectory viewer of `report.html`: static files that open from disk, no server.

`viewer/index.js` holds one row per query (status, verdict, confidence, tool calls, tokens,
cost, recall tiers); the page's table sorts and filters them. Opening a query loads its own
`viewer/q/<n>.js` (a script tag, which browsers allow on file://; fetch is not), so an 830-query
run with 40-turn trajectories opens in a browser as fast as its table: nothing else is read until
a query is opened. Each query file holds its turns (model text, tool calls with arguments,
observations and links to spill files, the steer, timings and waits) and, for every evidence and
gold document, its rank in each search and whether it was surfaced, previewed, opened or cited.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from piserini_ray.data import Benchmark, Query
from piserini_ray.metrics.cost import Price
from piserini_ray.records import Judgement, QueryRecord
from piserini_ray.reports.facts import QueryFacts
from piserini_ray.store.report_files import fresh_report_folder, write_report_file
from piserini_ray.tools.spill import safe_component

TIERS = ("surfaced", "previewed", "opened", "cited")

#: The index columns each part an imported record may lack (`records.UNAVAILABLE`) feeds: a
#: row lists them in its `unavailable` and the table shows them n/a, never 0 (their values are
#: None). The query page says the same of its timings and tokens.
UNAVAILABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "usage": ("tokens", "cost"),
    "previewed": ("recall.previewed",),
    "opened": ("recall.opened",),
    "behavior": ("recall.behavior",),
    "timing": ("steered",),
    "wall": ("wall",),
}


def unavailable_columns(parts: Iterable[str]) -> list[str]:
    """The index columns that `parts` (a record's `imported.unavailable`) leave n/a."""
    return [c for part in parts for c in UNAVAILABLE_COLUMNS.get(part, ())]


class ViewerWriter:
    """Writes a query's file as its record streams past (`observe`), then the index."""

    def __init__(self, run_dir: Path, benchmark: Benchmark, judgements: Mapping[str, Judgement]):
        self.folder = run_dir / "viewer"
        fresh_report_folder(self.folder)  # a report is rewritten whole
        (self.folder / "q").mkdir()
        self.queries: dict[str, Query] = {q.query_id: q for q in benchmark.queries}
        self.benchmark = benchmark
        self.judgements = judgements
        self.files: dict[str, str] = {}
        self.extra: dict[str, dict[str, Any]] = {}

    def observe(self, records: Iterable[QueryRecord]) -> Iterator[QueryRecord]:
        """Pass the records through, writing each one's query file on the way."""
        for record in records:
            self._write_query(record)
            yield record

    def _write_query(self, record: QueryRecord) -> None:
        name = f"{len(self.files)}.js"
        self.files[record.query_id] = name
        data = query_data(
            record,
            self.queries.get(record.query_id),
            self.judgements.get(record.query_id),
            self.benchmark,
        )
        self.extra[record.query_id] = {
            "turns": data.pop("turns_count"),
            "steered": data["steered"],
            "wall": data["seconds"]["wall"],
        }
        write_report_file(self.folder / "q" / name, query_script(data))

    def write_index(self, facts: Iterable[QueryFacts], price: Price | None) -> Path:
        rows = []
        for f in sorted(facts, key=lambda f: f.position):
            if f.query_id not in self.files:
                continue
            evidence = {
                tier: None
                if (cell := f.recall.get(tier, {}).get("evidence")) is None or cell[1] == 0
                else cell[0] / cell[1]
                for tier in (*TIERS, "behavior")
            }
            # Usage the record's format does not report is unknown: no tokens, no cost.
            usage = "usage" not in f.unavailable
            extra = self.extra[f.query_id]
            missing = unavailable_columns(f.unavailable)
            if extra["turns"] is None:  # no trajectory, and the format does not count turns
                missing.append("turns")
            rows.append(
                {
                    "id": f.query_id,
                    "file": self.files[f.query_id],
                    "status": f.status,
                    "correct": None if f.verdict != "judged" else bool(f.correct),
                    "confidence": round(100 * f.agent_confidence, 1),
                    "tool_calls": sum(f.tool_calls.values()),
                    "tokens": f.usage.input_tokens + f.usage.output_tokens if usage else None,
                    "cost": None if price is None or not usage else price.cost(f.usage),
                    "recall": evidence,
                    **extra,
                    "unavailable": missing,
                }
            )
        path = self.folder / "index.js"
        return write_report_file(path, f"window.piseriniRows = {orjson.dumps(rows).decode()};\n")


def query_script(data: dict[str, Any]) -> str:
    """A query's viewer file: the script that hands its data to the page."""
    return f"window.piseriniQuery({orjson.dumps(data).decode()});\n"


def query_data(
    record: QueryRecord, query: Query | None, judgement: Judgement | None, benchmark: Benchmark
) -> dict[str, Any]:
    """What the viewer shows of one query (its `viewer/q/<n>.js`; the live web view serves
    the same, `monitor/web.py`), with `turns_count` for its index row."""
    source = record.imported
    # A part the record's format lacks is None (n/a), never its empty field's 0.
    turns = len(record.trajectory) if record.has("trajectory") else record.turns
    steered = record.steered if record.has("timing") else None
    wall = record.wall_seconds if record.has("wall") else None
    return {
        "id": record.query_id,
        "question": query.query if query else None,
        "gold": query.answer if query else None,
        "status": record.status,
        "termination": record.termination,
        "error": record.error,
        "steered": steered,
        "final_answer": record.final_answer,
        "exact_answer": record.exact_answer,
        "confidence": record.confidence,
        "confidence_missing": record.confidence_missing,
        "seconds": {
            "wall": wall,
            "charged": record.charged_seconds if record.has("timing") else None,
            "waited": record.waited_seconds if record.has("timing") else None,
            "clock": record.budget_clock if record.has("timing") else None,
        },
        "usage": record.usage.model_dump(mode="json") if record.has("usage") else None,
        "imported": None
        if source is None
        else {"format": source.format, "file": source.file, "unavailable": source.unavailable},
        "verdict": judgement.model_dump(mode="json", exclude={"usage"}) if judgement else None,
        "turns": [_turn(record, t.model_dump(mode="json")) for t in record.trajectory],
        "searches": [{"id": s.search_id, "query": s.query} for s in record.rankings],
        "documents": _documents(record, benchmark),
        "turns_count": turns,
    }


def _turn(record: QueryRecord, turn: dict[str, Any]) -> dict[str, Any]:
    spill = f"spill/{safe_component(record.query_id)}/"
    for call in turn["tool_calls"]:
        # Arguments as the model sent them; shown parsed when they parse.
        with contextlib.suppress(orjson.JSONDecodeError):
            call["arguments"] = orjson.loads(call["arguments"])
        if call.get("spill_file"):
            call["spill_href"] = spill + call["spill_file"]
    return turn


def _documents(record: QueryRecord, benchmark: Benchmark) -> list[dict[str, Any]]:
    """Every evidence and gold document: its rank in each search (None: not in it) and the
    tiers it reached."""
    qid = record.query_id
    kinds: dict[str, list[str]] = {}
    for kind, table in (("evidence", benchmark.evidence), ("gold", benchmark.gold)):
        for docid, relevance in table.get(qid, {}).items():
            if relevance > 0:
                kinds.setdefault(docid, []).append(kind)
    positions = [{d: i + 1 for i, d in enumerate(s.docids)} for s in record.rankings]
    sets = {tier: set(getattr(record, tier)) for tier in TIERS}
    return [
        {
            "docid": docid,
            "kinds": found,
            "ranks": [p.get(docid) for p in positions],
            "tiers": [tier for tier in TIERS if docid in sets[tier]],
        }
        for docid, found in kinds.items()
    ]


#: The viewer's page part: a table of queries and a panel for the opened one. Data are set
#: with textContent only (model text is never parsed as HTML).
VIEWER_HTML = """<h2 id="queries">Queries</h2>
<p>Click a column to sort; type to filter (any cell, e.g. <code>timeout</code>); click a row to
open its trajectory. The page address keeps the state: <code>#q=ID</code>,
<code>#filter=TEXT</code>.</p>
<input id="filter" placeholder="filter" size="40"> <span id="shown"></span>
<table id="query-table"><thead><tr></tr></thead><tbody></tbody></table>
<div id="detail"></div>
<script src="viewer/index.js"></script>
<script>
(() => {
  const rows = window.piseriniRows || [];
  const cols = [
    ["id", "query"], ["status", "status"], ["correct", "correct"],
    ["confidence", "confidence"], ["tool_calls", "tool calls"], ["turns", "turns"],
    ["tokens", "tokens"], ["cost", "cost $"], ["wall", "seconds"], ["steered", "steered"],
    ["recall.surfaced", "surfaced"], ["recall.previewed", "previewed"],
    ["recall.opened", "opened"], ["recall.cited", "cited"], ["recall.behavior", "behavior"],
  ];
  const get = (r, k) => k.split(".").reduce((o, p) => (o == null ? o : o[p]), r);
  // A column the row's imported format lacks is n/a, never 0 (its value is null).
  const show = (v, k, r) => r && (r.unavailable || []).includes(k) ? "n/a" : v == null ? ""
    : k.startsWith("recall.") ? (100 * v).toFixed(0) + "%"
    : k === "cost" ? v.toFixed(4) : typeof v === "boolean" ? (v ? "yes" : "no") : String(v);
  const el = (tag, text, cls) => {
    const e = document.createElement(tag);
    if (text != null) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  };
  const head = document.querySelector("#query-table thead tr");
  const body = document.querySelector("#query-table tbody");
  let sortKey = null, sortDir = 1;
  cols.forEach(([k, label]) => {
    const th = el("th", label);
    th.dataset.key = k;
    th.onclick = () => { sortDir = sortKey === k ? -sortDir : 1; sortKey = k; render(); };
    head.appendChild(th);
  });
  const filter = document.getElementById("filter");
  const state = () => Object.fromEntries(location.hash.slice(1).split("&").filter(Boolean)
    .map(p => p.split("=").map(decodeURIComponent)));
  const setState = (k, v) => {
    const s = state();
    if (v) s[k] = v; else delete s[k];
    history.replaceState(null, "", "#" + Object.entries(s)
      .map(([a, b]) => encodeURIComponent(a) + "=" + encodeURIComponent(b)).join("&"));
  };
  function render() {
    const needle = filter.value.toLowerCase();
    let shown = rows.filter(r => !needle ||
      cols.some(([k]) => show(get(r, k), k, r).toLowerCase().includes(needle)));
    if (sortKey) shown = shown.slice().sort((a, b) => {
      const x = get(a, sortKey), y = get(b, sortKey);
      return (x == null) - (y == null) || (x < y ? -1 : x > y ? 1 : 0) * sortDir;
    });
    body.replaceChildren(...shown.map(r => {
      const tr = el("tr");
      tr.dataset.query = r.id;
      cols.forEach(([k]) => tr.appendChild(el("td", show(get(r, k), k, r))));
      tr.onclick = () => open(r.id);
      return tr;
    }));
    document.getElementById("shown").textContent = shown.length + " of " + rows.length;
  }
  filter.oninput = () => { setState("filter", filter.value); render(); };
  function open(id) {
    const row = rows.find(r => r.id === id);
    if (!row) return;
    setState("q", id);
    const detail = document.getElementById("detail");
    detail.replaceChildren(el("p", "loading " + id + " ..."));
    const script = document.createElement("script");
    script.src = "viewer/q/" + row.file;
    document.body.appendChild(script);
  }
  const secs = (v) => v == null ? "n/a" : v.toFixed(1) + " s";
  window.piseriniQuery = (q) => {
    const row = rows.find(r => r.id === q.id);
    const d = document.getElementById("detail");
    d.replaceChildren();
    d.dataset.query = q.id;
    d.appendChild(el("h3", "Query " + q.id));
    const facts = [["question", q.question], ["gold answer", q.gold],
      ["exact answer", q.exact_answer], ["confidence", q.confidence +
        (q.confidence_missing ? " (missing)" : "")],
      ["status", q.status + (q.termination ? " (" + q.termination + ")" : "") +
        (q.error ? ": " + q.error : "")],
      ["verdict", q.verdict ? (q.verdict.status === "judged" ?
        (q.verdict.correct ? "correct" : "wrong") + " (" + q.verdict.judge_model + ")" :
        "judge failed") : "not judged"],
      ["time", secs(q.seconds.wall) + " wall, " + secs(q.seconds.charged) + " charged" +
        (q.seconds.clock == null ? "" : " (" + q.seconds.clock + " clock)") + ", " +
        secs(q.seconds.waited) + " waiting"],
      ["tokens", q.usage == null ? "n/a" : q.usage.input_tokens + " in / " +
        q.usage.output_tokens + " out"],
      ["cost $", row == null || row.cost == null ? "n/a" : row.cost.toFixed(4)]];
    if (q.imported) facts.push(["imported", q.imported.format + " (" + q.imported.file +
      "): not in that format, shown n/a, never 0: " + q.imported.unavailable.join(", ")]);
    const dl = el("dl");
    facts.forEach(([k, v]) => { dl.appendChild(el("dt", k)); dl.appendChild(el("dd", v)); });
    d.appendChild(dl);
    d.appendChild(el("h4", "Where the evidence and gold documents sat"));
    const docs = el("table", null, "documents");
    const hr = el("tr");
    ["document", "qrels", "tiers", ...q.searches.map((s, i) => "search " + (i + 1) + ": " +
      s.query)].forEach(h => hr.appendChild(el("th", h)));
    docs.appendChild(hr);
    q.documents.forEach(doc => {
      const tr = el("tr");
      tr.appendChild(el("td", doc.docid));
      tr.appendChild(el("td", doc.kinds.join(", ")));
      tr.appendChild(el("td", doc.tiers.join(", ") || "never surfaced"));
      doc.ranks.forEach(r => tr.appendChild(el("td", r == null ? "-" : "#" + r)));
      docs.appendChild(tr);
    });
    d.appendChild(docs);
    d.appendChild(el("h4", "Trajectory"));
    if (q.imported && q.imported.unavailable.includes("trajectory"))
      d.appendChild(el("p", "n/a: not in the " + q.imported.format + " format"));
    q.turns.forEach(t => {
      const turn = el("div", null, "turn");
      if (t.steered) turn.appendChild(el("p", "steer: submit now (tools blocked)", "steer"));
      turn.appendChild(el("h5", "turn " + (t.index + 1) + " at " +
        t.started_at_charged.toFixed(1) + " s: model " + t.model_seconds.toFixed(2) +
        " s, waited " + t.waited_seconds.toFixed(2) + " s, " + t.usage.input_tokens +
        " in / " + t.usage.output_tokens + " out tokens" +
        (t.usage_estimated ? " (prompt estimated: " + t.estimate_method + ")" : "") +
        (t.attempts > 1 ? ", " + t.attempts + " attempts" : "")));
      t.retries.forEach(r => turn.appendChild(el("p", "retry: " + r, "retry")));
      if (t.model_output) turn.appendChild(el("pre", t.model_output, "model-output"));
      t.tool_calls.forEach(c => {
        const call = el("details", null, "tool-call");
        const args = typeof c.arguments === "string" ? c.arguments
          : JSON.stringify(c.arguments);
        call.appendChild(el("summary", c.name + " " + args + (c.ok ? "" : " (failed)") +
          " " + c.seconds.toFixed(2) + " s"));
        if (c.reason) call.appendChild(el("p", "reason: " + c.reason));
        call.appendChild(el("pre", c.observation));
        if (c.spill_href) {
          const a = el("a", "full output: " + c.spill_file);
          a.href = c.spill_href;
          call.appendChild(a);
        }
        turn.appendChild(call);
      });
      d.appendChild(turn);
    });
    d.dataset.turns = q.turns.length;
  };
  filter.value = state().filter || "";
  render();
  if (state().q) open(state().q);
})();
</script>"""
