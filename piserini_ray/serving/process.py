"""One model server as a child process of this one (`ServerProcess`): found (the engine
installed, the weights there, the port free), started, waited for until it answers its health
and model checks, and stopped, also when this process dies (the child is told by the kernel:
`PR_SET_PDEATHSIG`). Every failure is a `ServeError` that names the node, the engine, what to
fix, and the server's last log lines."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from pathlib import Path

from piserini_ray.config import ModelConfig
from piserini_ray.config.serving import ServeConfig
from piserini_ray.errors import ConfigError, PiseriniRayError
from piserini_ray.serving.presets import PRESETS

#: The server's log lines a failure quotes.
LOG_LINES = 20
#: How often a starting server is asked whether it answers yet.
POLL_SECONDS = 0.25
#: How long a server may take to end after SIGTERM before it is killed.
STOP_SECONDS = 10.0
PACKAGE = "package:"


class ServeError(PiseriniRayError):
    """A model server could not be started or stopped answering; the message names the node,
    the engine and the fix, with the server's last log lines."""


#: Run before the engine's command, in the child: the kernel sends it SIGTERM when the thread
#: that started it dies, however it dies (`PR_SET_PDEATHSIG`, kept across `exec`), then it
#: becomes the command. A small program, not `preexec_fn`, which is unsafe in a process with
#: threads (a Ray worker).
DIE_WITH_PARENT = (
    "import ctypes, os, sys; ctypes.CDLL('libc.so.6').prctl(1, 15); "
    "os.execvp(sys.argv[1], sys.argv[1:])"
)


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_taken(host: str, port: int) -> bool:
    with socket.socket() as sock:
        # As a server binds (SO_REUSEADDR): a port whose last server just died is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


class ServerProcess:
    """One server of `name` (the model name it answers to) on `host`, as `serve` says. `node`
    names this machine in messages. `port`: 0 picks a free one."""

    def __init__(
        self, serve: ServeConfig, name: str, node: str, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.serve, self.name, self.node, self.host = serve, name, node, host
        self.preset = PRESETS[serve.engine]
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self.started_at: float | None = None
        self.stopped_at: float | None = None
        self._stopping = False

    @property
    def api_base(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def _where(self) -> str:
        return f"{self.serve.engine} server of {self.name} on node {self.node}"

    # ------------------------------------------------------------------ before starting

    def check_installed(self) -> None:
        """The engine is there: its module imports in its Python, or its command exists."""
        preset, serve = self.preset, self.serve
        if preset.module is None:
            command = serve.executable or preset.engine
            if not _which(command):
                raise ServeError(
                    f"{self._where()}: {preset.engine} is not installed there ({command!r} is "
                    "not on the PATH); install it on that node, or set serve.executable to its "
                    "command"
                )
            return
        python = serve.executable or _this_python()
        done = subprocess.run(
            [python, "-c", f"import {preset.module}"], capture_output=True, text=True
        )
        if done.returncode != 0:
            last = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
            raise ServeError(
                f"{self._where()}: {preset.engine} is not installed for {python} ({last[0]}); "
                "install it on that node (llama.cpp: `make serving`, the pinned "
                "llama-cpp-python[server]), or set serve.executable to a Python that has it"
            )

    def resolve_model(self) -> str:
        """The weights' path or name as the engine takes it; `package:<module>` asks the
        package (installed beside the engine) to assemble its file."""
        model = self.serve.model
        if model.startswith(PACKAGE):
            module = model.removeprefix(PACKAGE)
            python = self.serve.executable or _this_python()
            program = (
                "import importlib, sys; print(importlib.import_module(sys.argv[1]).assemble())"
            )
            done = subprocess.run([python, "-c", program, module], capture_output=True, text=True)
            if done.returncode != 0:
                last = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
                raise ServeError(
                    f"{self._where()}: serve.model {model!r}: the package {module} could not "
                    f"give its weights with {python} ({last[0]}); install it beside the engine"
                )
            model = done.stdout.strip().splitlines()[-1]
        if self.serve.engine == "llama.cpp" and not Path(model).is_file():
            raise ServeError(
                f"{self._where()}: serve.model {model!r} is not a file on that node; llama.cpp "
                f"serves {self.preset.weights}: give its path there (weights are never "
                "downloaded by a run)"
            )
        return model

    # ------------------------------------------------------------------ the server

    def start(self) -> str:
        """Start the server and wait until it answers; its API base. Raises `ServeError`."""
        self.check_installed()
        model = self.resolve_model()
        if self.port == 0:
            self.port = free_port(self.host)
        elif port_taken(self.host, self.port):
            raise ConfigError(
                f"{self._where()}: port {self.port} is taken; free it or let the run pick one"
            )
        command = self.preset.command(self.serve, model, self.name, self.host, self.port)
        handle, log = tempfile.mkstemp(prefix=f"piserini-serve-{self.port}-", suffix=".log")
        self.log_path = Path(log)
        with os.fdopen(handle, "wb") as out:
            self.process = subprocess.Popen(
                [_this_python(), "-c", DIE_WITH_PARENT, *command],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: stopped whole, never by our Ctrl-C
            )
        self.started_at = self.started_at or time.time()  # a restart keeps the first
        try:
            self._wait_ready()
        except BaseException:
            self._end()
            raise
        return self.api_base

    def _wait_ready(self) -> None:
        """Until the health path answers 200 and `/v1/models` lists the name: the process
        ending or the time-out is a `ServeError` with its last log lines."""
        assert self.process is not None
        end = time.monotonic() + self.serve.startup_timeout
        base = f"http://{self.host}:{self.port}"
        while True:
            code = self.process.poll()
            if code is not None:
                raise ServeError(
                    f"{self._where()} exited with status {code} before it answered:\n"
                    + self.last_lines()
                )
            if _get(base + self.preset.health_path) is not None:
                models = _get(base + "/v1/models")
                listed = (models or {}).get("data")
                served = (
                    [m.get("id") for m in listed if isinstance(m, dict)]
                    if isinstance(listed, list)
                    else []
                )
                if self.name in served:
                    return
                if models is not None:
                    raise ServeError(
                        f"{self._where()} answers but serves {served}, not {self.name!r}:\n"
                        + self.last_lines()
                    )
            if time.monotonic() > end:
                raise ServeError(
                    f"{self._where()} did not answer its health check within "
                    f"{self.serve.startup_timeout:g} s (serve.startup_timeout):\n"
                    + self.last_lines()
                )
            time.sleep(POLL_SECONDS)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def supervise(self, log: Callable[[str], None], max_restarts: int = 5) -> int:
        """Until `stop`: wait for the server to exit, and start it again on the same port
        (the calls in flight to it fail, are retried by their clients, and reach the new
        server at the same address: no query is lost or answered twice). Gives up after
        `max_restarts` restarts in a row that did not come up. Returns the restarts."""
        restarts = failures = 0
        while True:
            process = self.process
            if process is None:
                return restarts
            code = process.wait()
            if self.process is not process or self._stopping:
                return restarts  # stopped on purpose
            log(f"{self._where()} exited with status {code}; starting it again on port {self.port}")
            self.process = None
            try:
                self.start()
            except PiseriniRayError as error:
                failures += 1
                log(f"{self._where()} did not come back ({error})")
                if failures >= max_restarts:
                    return restarts
                time.sleep(POLL_SECONDS * 4)
                continue
            restarts, failures = restarts + 1, 0
            log(f"{self._where()} is back at {self.api_base}")

    def last_lines(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "  (no log)"
        with self.log_path.open("rb") as log:
            tail = deque(log, maxlen=LOG_LINES)
        text = b"".join(tail).decode("utf-8", "replace").rstrip()
        return "\n".join(f"  {line}" for line in text.splitlines()) or "  (no output)"

    def stop(self) -> None:
        """End the server for good (its whole process group), politely first."""
        self._stopping = True
        if self.process is not None:
            self.stopped_at = time.time()
        self._end()

    def _end(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)

    def seconds_up(self) -> float:
        """How long it has been up (to now, or to its stop)."""
        if self.started_at is None:
            return 0.0
        return (self.stopped_at or time.time()) - self.started_at


def _get(url: str) -> dict[str, object] | None:
    """The JSON of a GET that answers 200 (an empty dict for a body that is not JSON); None
    when it does not (yet)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            if answer.status != 200:
                return None
            body = answer.read()
    except (urllib.error.URLError, OSError, ValueError):
        return None
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _which(command: str) -> bool:
    import shutil

    return shutil.which(command) is not None


def _this_python() -> str:
    import sys

    return sys.executable


def served_key(model: ModelConfig) -> str:
    """One set of servers per served model: its name and `serve` block."""
    return model.model_dump_json(include={"name", "serve"})
