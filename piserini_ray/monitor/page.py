"""The live web view's two pages (`monitor/web.py`): the runs under the watched path, updated
in place every two seconds from `/api/runs`, and one run's trajectories in the report's own
viewer (`reports/viewer.py`), its data served live. Text is set with textContent only: model
output is never parsed as HTML."""

from __future__ import annotations

from piserini_ray.reports.viewer import VIEWER_HTML

_STYLE = """<style>
body { font: 13px system-ui, sans-serif; margin: 1em; color: #222; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { border-bottom: 1px solid #ddd; padding: .25em .4em; text-align: right; }
th { vertical-align: bottom; }
th:first-child, td:first-child { text-align: left; word-break: break-all; min-width: 12em; }
.bar { width: 5em; height: .7em; background: #eee; display: inline-block; }
.bar span { display: block; height: 100%; background: #3a7; }
.state-stale, .state-interrupted { color: #b30; font-weight: bold; }
.state-stopped { color: #a60; }
.state-decided { color: #26a; }
.state-running, .state-judging { color: #272; }
#message { color: #a60; }
pre { white-space: pre-wrap; background: #f6f6f6; padding: .4em; }
</style>"""

WATCH_PAGE = (
    """<!doctype html><html><head><meta charset="utf-8"><title>piserini-ray watch</title>"""
    + _STYLE
    + """</head><body>
<h1>piserini-ray: runs as they go</h1>
<p>Watching <code id="root"></code>; read at <span id="read-at"></span>
(<span id="polls">0</span> looks, every 2 s; no reload needed). Counts are the records on
disk when read; the rest is each run's <code>status.json</code>.</p>
<table id="runs"><thead><tr>
<th>run</th><th>state</th><th>progress</th><th>recorded</th><th>completed</th>
<th>timeout</th><th>failed</th><th>running</th><th>waiting</th><th>retries</th>
<th>judged</th><th>accuracy so far [95% CI]</th><th>tokens</th><th>cost $</th>
<th>queries/min</th><th>ETA</th><th>replicas</th><th></th>
</tr></thead><tbody></tbody></table>
<p id="message"></p>
<script>
(() => {
  const el = (tag, text, cls) => {
    const e = document.createElement(tag);
    if (text != null) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  };
  const pct = (v) => v == null ? "" : (100 * v).toFixed(1);
  const dur = (s) => s == null ? "?" : s < 60 ? s.toFixed(0) + " s"
    : Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
  const sum = (o) => Object.values(o || {}).reduce((a, b) => a + b, 0);
  let polls = 0;
  async function stop(run) {
    const message = document.getElementById("message");
    const answer = await fetch("/api/stop", {method: "POST", credentials: "same-origin",
      headers: {"Content-Type": "application/json"}, body: JSON.stringify({run: run.key})});
    const data = await answer.json();
    message.textContent = data.ok ? data.message : "not stopped: " + data.error;
  }
  function row(run) {
    const s = run.status || {};
    const r = run.records;
    const tr = el("tr");
    tr.dataset.run = run.key;
    tr.dataset.name = run.name;
    const cell = (field, text, cls) => {
      const td = el("td", text, cls);
      td.dataset.field = field;
      tr.appendChild(td);
      return td;
    };
    const name = cell("name", null);
    const link = el("a", run.name);
    link.href = "run/" + run.key + "/";
    link.title = run.run_dir;
    name.appendChild(link);
    cell("state", run.state + (run.state === "stale" ? " (last written " +
      dur(run.age_seconds) + " ago)" : ""), "state-" + run.state);
    const bar = el("span", null, "bar");
    const fill = el("span");
    fill.style.width = (s.queries ? 100 * r.total / s.queries : 0) + "%";
    bar.appendChild(fill);
    cell("progress", null).appendChild(bar);
    cell("recorded", r.total + (s.queries != null ? " / " + s.queries : ""));
    cell("completed", String(r.completed || 0));
    cell("timeout", String(r.timeout || 0));
    cell("failed", String(r.failed || 0));
    cell("running", String(s.running || 0));
    cell("waiting", String(s.waiting_on_limiter || 0));
    cell("retries", Object.entries(s.retries || {}).map(([k, v]) => k + " " + v).join(", ")
      || "0");
    cell("judged", String(s.judged || 0));
    cell("accuracy", s.accuracy_judged == null ? "" : pct(s.accuracy_judged) + " [" +
      pct(s.accuracy_ci95[0]) + ", " + pct(s.accuracy_ci95[1]) + "]");
    cell("tokens", sum(s.tokens) ? ((s.tokens.input_tokens || 0) +
      (s.tokens.output_tokens || 0)).toLocaleString() : "0");
    cell("cost", s.cost_usd == null ? "unpriced" : s.cost_usd.toFixed(4) +
      (s.cost_estimated_usd ? " (" + s.cost_estimated_usd.toFixed(4) + " est.)" : ""));
    cell("pace", s.queries_per_minute == null ? "" : s.queries_per_minute.toFixed(1));
    cell("eta", run.state === "running" ? dur(s.eta_seconds) : "");
    cell("replicas", Object.entries(s.replicas || {}).map(([k, v]) => k + " x" + v)
      .join(", "));
    const actions = cell("actions", null);
    if (run.state === "running") {
      const button = el("button", "stop");
      button.onclick = () => stop(run);
      actions.appendChild(button);
    }
    return tr;
  }
  async function look() {
    try {
      const answer = await fetch("/api/runs", {credentials: "same-origin"});
      const data = await answer.json();
      document.getElementById("root").textContent = data.root;
      document.getElementById("read-at").textContent = data.read_at;
      document.querySelector("#runs tbody").replaceChildren(...data.runs.map(row));
      document.getElementById("polls").textContent = String(++polls);
      document.body.dataset.polls = String(polls);
    } catch (e) {
      document.getElementById("message").textContent = "the watch server did not answer: " + e;
    }
  }
  look();
  setInterval(look, 2000);
})();
</script></body></html>"""
)

RUN_PAGE = (
    """<!doctype html><html><head><meta charset="utf-8"><title>{name}</title>"""
    + _STYLE
    + """</head><body><p><a href="../../">all runs</a></p><h1>{name}</h1>
<p>The queries recorded when this page was loaded (reload for more).</p>"""
    + VIEWER_HTML
    + "</body></html>"
)
