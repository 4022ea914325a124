"""The live web view (`piserini-ray watch PATH`): a page that shows every run under PATH as it
goes, and the trajectories of the queries recorded so far, served by the standard library's
threaded HTTP server (nothing to install, nothing to build).

What it shows comes from the run directories only, read, never written, and never locked (the
store's lock is its driver's): each run's `status.json` (`monitor/status.py`), and its records
read as they are written (`RecordTail`: only the bytes added since the last look, a line counted
once it ends with its newline), so the page's counts are the records on disk when it asked.
A query opens in the report's own trajectory viewer (`reports/viewer.py`), its data made from its
record on the spot.

On 127.0.0.1 anyone on this machine may look; another address (`--host`) needs the token the
command prints for every request, and stopping a run (`piserini-ray stop`'s button) always
needs it: the printed address carries it, and the page keeps it in a same-site cookie.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import html
import ipaddress
import secrets
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

from piserini_ray.config import RunConfig
from piserini_ray.data import Benchmark, load_benchmark
from piserini_ray.errors import PiseriniRayError
from piserini_ray.metrics.cost import Price, pricing_for
from piserini_ray.monitor.page import RUN_PAGE, WATCH_PAGE
from piserini_ray.monitor.status import (
    MonitorError,
    now_iso,
    read_status,
    request_stop,
    run_dirs_under,
)
from piserini_ray.records import Judgement, QueryRecord
from piserini_ray.reports.viewer import query_data, query_script
from piserini_ray.store import manifest_config
from piserini_ray.tools.spill import safe_component

Log = Callable[[str], None]
COOKIE = "piserini_watch_token"


@dataclass
class RecordTail:
    """A run's `records.jsonl` read as it grows: counts by status, and where each recorded
    query's line is. A file rewritten in place (a resume takes failed queries out) is read
    again from its start."""

    path: Path
    offset: int = 0
    inode: int | None = None
    statuses: Counter[str] = field(default_factory=Counter)
    #: Each recorded query: (offset, length) of its line, in the order written.
    lines: dict[str, tuple[int, int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def refresh(self) -> None:
        with self.lock:
            try:
                stat = self.path.stat()
            except FileNotFoundError:
                self._reset(None)
                return
            if stat.st_ino != self.inode or stat.st_size < self.offset:
                self._reset(stat.st_ino)
            if stat.st_size == self.offset:
                return
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read(stat.st_size - self.offset)
            end = chunk.rfind(b"\n") + 1  # a line being written counts once it is whole
            position = self.offset
            for line in chunk[:end].splitlines(keepends=True):
                with contextlib.suppress(orjson.JSONDecodeError):
                    row = orjson.loads(line)
                    self.statuses[str(row.get("status"))] += 1
                    self.lines[str(row["query_id"])] = (position, len(line))
                position += len(line)
            self.offset += end

    def _reset(self, inode: int | None) -> None:
        self.inode, self.offset = inode, 0
        self.statuses.clear()
        self.lines.clear()

    def record(self, query_id: str) -> QueryRecord | None:
        with self.lock:
            where = self.lines.get(query_id)
        if where is None:
            return None
        with open(self.path, "rb") as f:
            f.seek(where[0])
            return QueryRecord.model_validate(orjson.loads(f.read(where[1])))


@dataclass
class WatchedRun:
    """One run directory under the watched path."""

    run_dir: Path
    key: str
    tail: RecordTail
    _config: RunConfig | None = None
    _benchmark: Benchmark | None = None
    _price: Price | None = None

    @property
    def config(self) -> RunConfig:
        if self._config is None:
            self._config = manifest_config(self.run_dir)
            self._price = pricing_for(self._config).model_price(self._config.model)
        return self._config

    @property
    def price(self) -> Price | None:
        """The run's model's price (None: unpriced)."""
        _ = self.config  # reads the price with it
        return self._price

    @property
    def benchmark(self) -> Benchmark:
        if self._benchmark is None:
            self._benchmark = load_benchmark(self.config.benchmark)
        return self._benchmark

    def verdicts(self) -> dict[str, Judgement]:
        """The run's judge's verdicts so far (first judged, else latest failure), read whole:
        a verdict is a short line."""
        judge = safe_component(self.config.judge_model().name)
        path = self.run_dir / "judgements" / f"{judge}.jsonl"
        found: dict[str, Judgement] = {}
        with contextlib.suppress(FileNotFoundError):
            for line in path.read_bytes().splitlines():
                with contextlib.suppress(orjson.JSONDecodeError, ValueError):
                    verdict = Judgement.model_validate(orjson.loads(line))
                    previous = found.get(verdict.query_id)
                    if previous is None or previous.status == "judge_failed":
                        found[verdict.query_id] = verdict
        return found

    def summary(self) -> dict[str, Any]:
        """The run's row on the page: its status file and the records on disk now."""
        self.tail.refresh()
        seen = read_status(self.run_dir)
        with self.tail.lock:
            on_disk = dict(self.tail.statuses)
        return {
            "key": self.key,
            "run_dir": str(self.run_dir),
            "name": self.run_dir.name,
            "state": seen.state if seen is not None else "unknown",
            "age_seconds": seen.age_seconds if seen is not None else None,
            "status": seen.status.model_dump(mode="json") if seen is not None else None,
            "records": {"total": sum(on_disk.values()), **on_disk},
        }

    def index_rows(self) -> list[dict[str, Any]]:
        """The trajectory viewer's table (its `viewer/index.js`) over the records so far."""
        self.tail.refresh()
        with self.tail.lock:
            ids = list(self.tail.lines)
        verdicts = self.verdicts()
        rows: list[dict[str, Any]] = []
        for number, query_id in enumerate(ids):
            record = self.tail.record(query_id)
            if record is None:
                continue
            verdict = verdicts.get(query_id)
            price = self.price
            rows.append(
                {
                    "id": query_id,
                    "file": f"{number}.js",
                    "status": record.status,
                    "correct": None
                    if verdict is None or verdict.status != "judged"
                    else bool(verdict.correct),
                    "confidence": record.confidence,
                    "tool_calls": sum(record.tool_call_counts.values()),
                    "turns": len(record.trajectory),
                    "tokens": record.usage.input_tokens + record.usage.output_tokens,
                    "cost": None if price is None else price.cost(record.usage),
                    "wall": record.wall_seconds,
                    "steered": record.steered,
                    "recall": {},
                    "unavailable": [],
                }
            )
        return rows

    def query(self, number: int) -> str | None:
        """The viewer file of the `number`-th recorded query."""
        with self.tail.lock:
            ids = list(self.tail.lines)
        if not 0 <= number < len(ids):
            return None
        record = self.tail.record(ids[number])
        if record is None:
            return None
        queries = {q.query_id: q for q in self.benchmark.queries}
        data = query_data(
            record,
            queries.get(record.query_id),
            self.verdicts().get(record.query_id),
            self.benchmark,
        )
        data.pop("turns_count")
        return query_script(data)


class WatchApp:
    """What the server knows: the watched path, its runs (found again at every look: a sweep
    adds run directories as it goes), the token."""

    def __init__(self, root: Path, token: str, open_reads: bool) -> None:
        self.root = Path(root).absolute()
        self.token = token
        #: Reads need no token (the server listens on loopback only).
        self.open_reads = open_reads
        self._runs: dict[str, WatchedRun] = {}
        self._lock = threading.Lock()
        self.runs()  # a path with no run is an error now, not a blank page

    def runs(self) -> list[WatchedRun]:
        found = run_dirs_under(self.root)
        with self._lock:
            for run_dir in found:
                key = hashlib.sha256(str(run_dir).encode()).hexdigest()[:12]
                if key not in self._runs:
                    tail = RecordTail(run_dir / "records.jsonl")
                    self._runs[key] = WatchedRun(run_dir, key, tail)
            return [self._runs[k] for k in sorted(self._runs, key=lambda k: self._runs[k].run_dir)]

    def run(self, key: str) -> WatchedRun | None:
        self.runs()
        with self._lock:
            return self._runs.get(key)

    def overview(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "read_at": now_iso(),
            "runs": [run.summary() for run in self.runs()],
        }


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a page polls every two seconds: the terminal stays the run's

    # ------------------------------------------------------------------ auth

    def _token_given(self) -> str | None:
        query = parse_qs(urlsplit(self.path).query)
        if "token" in query:
            return query["token"][0]
        if header := self.headers.get("X-Piserini-Token"):
            return header
        cookie = SimpleCookie(self.headers.get("Cookie", ""))
        return cookie[COOKIE].value if COOKIE in cookie else None

    def _authorized(self) -> bool:
        given = self._token_given()
        return given is not None and hmac.compare_digest(given, self.server.app.token)

    # ------------------------------------------------------------------ replies

    def _send(
        self,
        body: bytes | str,
        content_type: str,
        status: HTTPStatus = HTTPStatus.OK,
        cookie: bool = False,
    ) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        if cookie:
            self.send_header(
                "Set-Cookie", f"{COOKIE}={self.server.app.token}; Path=/; HttpOnly; SameSite=Strict"
            )
        self.end_headers()
        self.wfile.write(data)

    def _json(self, data: Any, status: HTTPStatus = HTTPStatus.OK) -> None:
        self._send(orjson.dumps(data), "application/json", status)

    def _not_found(self) -> None:
        self._send("not found", "text/plain; charset=utf-8", HTTPStatus.NOT_FOUND)

    # ------------------------------------------------------------------ routes

    def do_GET(self) -> None:
        app = self.server.app
        authorized = self._authorized()
        if not (app.open_reads or authorized):
            self._send(
                "this page needs the token that `piserini-ray watch` printed (?token=...)",
                "text/plain; charset=utf-8",
                HTTPStatus.UNAUTHORIZED,
            )
            return
        path = urlsplit(self.path).path
        try:
            self._route(path, authorized)
        except (PiseriniRayError, OSError, ValueError) as e:
            self._json({"error": str(e)}, HTTPStatus.INTERNAL_SERVER_ERROR)

    def _route(self, path: str, authorized: bool) -> None:
        app = self.server.app
        if path == "/":
            self._send(WATCH_PAGE, "text/html; charset=utf-8", cookie=authorized)
            return
        if path == "/api/runs":
            self._json(app.overview())
            return
        parts = path.strip("/").split("/")
        if len(parts) < 2 or parts[0] != "run" or (run := app.run(parts[1])) is None:
            self._not_found()
            return
        rest = parts[2:]
        if rest in ([], [""]):
            page = RUN_PAGE.replace("{name}", html.escape(run.run_dir.name))
            self._send(page, "text/html; charset=utf-8")
        elif rest == ["viewer", "index.js"]:
            rows = orjson.dumps(run.index_rows()).decode()
            self._send(f"window.piseriniRows = {rows};\n", "text/javascript")
        elif len(rest) == 3 and rest[:2] == ["viewer", "q"] and rest[2].endswith(".js"):
            script = run.query(int(rest[2].removesuffix(".js")))
            self._send(script, "text/javascript") if script else self._not_found()
        elif rest[:1] == ["spill"] and len(rest) == 3:
            file = run.run_dir / "spill" / safe_component(rest[1]) / safe_component(rest[2])
            if file.is_file():
                self._send(file.read_bytes(), "text/plain; charset=utf-8")
            else:
                self._not_found()
        else:
            self._not_found()

    def do_POST(self) -> None:
        if urlsplit(self.path).path != "/api/stop":
            self._not_found()
            return
        if not self._authorized():
            self._json(
                {"error": "stopping a run needs the token that `piserini-ray watch` printed"},
                HTTPStatus.UNAUTHORIZED,
            )
            return
        length = int(self.headers.get("Content-Length") or 0)
        try:
            key = str(orjson.loads(self.rfile.read(length) or b"{}").get("run", ""))
        except orjson.JSONDecodeError:
            key = ""
        run = self.server.app.run(key)
        if run is None:
            self._json({"error": f"no run {key!r} under the watched path"}, HTTPStatus.NOT_FOUND)
            return
        try:
            request_stop(run.run_dir)
        except MonitorError as e:
            self._json({"error": str(e)}, HTTPStatus.CONFLICT)
            return
        self._json({"ok": True, "message": f"stop requested for {run.run_dir.name}"})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    app: WatchApp


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@dataclass
class Watch:
    """A running web view: its address (with the token) and how to stop it."""

    url: str
    token: str
    server: _Server
    thread: threading.Thread

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def start_watch(
    root: Path, host: str = "127.0.0.1", port: int = 8765, require_token: bool | None = None
) -> Watch:
    """Serve the web view of the runs under `root` on `host:port` (0: any free port), on a
    thread of its own; an error naming the path (no run there) or the port (taken). Every
    request needs the token when `require_token` (default: unless `host` is loopback)."""
    token = secrets.token_urlsafe(18)
    closed = not is_loopback(host) if require_token is None else require_token
    app = WatchApp(root, token, open_reads=not closed)
    try:
        server = _Server((host, port), _Handler)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise MonitorError(
                f"port {port} on {host} is taken (another watch, or another server); give "
                "another --port, or --port 0 for any free one"
            ) from None
        raise MonitorError(f"cannot listen on {host}:{port} ({e.strerror})") from None
    server.app = app
    thread = threading.Thread(target=server.serve_forever, name="watch", daemon=True)
    thread.start()
    bound = server.server_address[1]
    shown = f"[{host}]" if ":" in host else host
    return Watch(f"http://{shown}:{bound}/?token={token}", token, server, thread)
