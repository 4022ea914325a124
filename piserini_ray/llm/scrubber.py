"""The one scrubber: key values never reach a record, a verdict, a ledger, a manifest, a log
line, a progress line or an error message.

It works by VALUE. Every key this process holds is registered here (`hold`) the moment it is
read or handed over: the key a model's `api_key_env` names (whatever the variable is called),
the keys the driver hands to replicas, the key a batcher is given. Beside those, the value of
every environment variable whose name marks a secret (`config.secret_rules.SECRET_NAME`: litellm
reads `OPENAI_API_KEY`, `ANTHROPIC_API_KEY`, ... on its own when `api_key_env` is not set).

Where it is applied: the store's one JSONL writer (`store.JsonlFile`: records, judgements,
ledgers, batch ledgers) and its manifest and spill files (every report, viewer and export is
made from those), every error text a client or batcher keeps, and this process's own stdout
and stderr once it holds a key (`guard_output`: prints, logging, progress, litellm's own
messages), in the driver and in every Ray worker that is handed a key.
"""

from __future__ import annotations

import functools
import io
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any, TextIO

from pydantic import SecretStr

from piserini_ray.config import ModelConfig
from piserini_ray.config.secret_rules import SECRET_NAME
from piserini_ray.llm.routes import route_facts

#: Shorter values are not keys (flags like "1" or "true") and replacing them would mangle text.
MIN_SECRET_LENGTH = 8
MASK = "***"

_held: set[str] = set()
_lock = threading.Lock()


def hold(*values: str | SecretStr | None) -> None:
    """Register key values this process holds: from now on they are scrubbed from everything
    it writes or prints (and its stdout and stderr are guarded, `guard_output`)."""
    plain = (v.get_secret_value() if isinstance(v, SecretStr) else v for v in values)
    found = {v for v in plain if v and len(v) >= 4}
    if not found - _held:
        return
    with _lock:
        _held.update(found)
    guard_output()


@functools.lru_cache(maxsize=4096)
def _names_a_secret(name: str) -> bool:
    return SECRET_NAME.search(name) is not None


def secret_values(extra: Iterable[str | None] = ()) -> list[str]:
    """Every secret this process could send or has held, longest first (a key that contains
    another is removed whole). The environment is read again at every call (a key exported
    later counts), so a caller with many texts at once takes a `scrubber`."""
    found = {
        value
        for name, value in os.environ.items()
        if len(value) >= MIN_SECRET_LENGTH and _names_a_secret(name)
    }
    found |= _held
    found |= {value for value in extra if value and len(value) >= 4}
    return sorted(found, key=len, reverse=True)


def scrubber(extra: Iterable[str | None] = ()) -> Callable[[str], str]:
    """`scrub` with the secrets read once, for many texts at once (a query's trace: a
    thousand attributes, each scrubbed by `scrub` would read the environment again)."""
    values = secret_values(extra)

    def clean(text: str) -> str:
        for value in values:
            if value in text:
                text = text.replace(value, MASK)
        return text

    return clean


def scrub(text: str, extra: Iterable[str | None] = ()) -> str:
    """`text` with every secret value replaced by `***`."""
    return scrubber(extra)(text)


def scrub_bytes(data: bytes) -> bytes:
    """`scrub` for encoded text (a JSONL line, a file's bytes)."""
    for value in secret_values():
        raw = value.encode()
        if raw in data:
            data = data.replace(raw, MASK.encode())
    return data


def driver_keys(models: Iterable[ModelConfig]) -> dict[str, SecretStr]:
    """The values, read here (the driver), of every variable the models' calls read
    (`routes.route_facts`: a key, and for Azure or Bedrock the endpoint, version, region and
    credentials too): handed to the replicas with each query, in memory only (never a file, a
    log or a `runtime_env`), so that a node started without the user's environment can call
    the model. A variable this process lacks is left out: a node that has it uses its own.
    The secret ones are held for the scrubber."""
    keys = {}
    for model in models:
        facts = route_facts(model)
        for name in facts.variables:
            if value := os.environ.get(name):
                keys[name] = SecretStr(value)
                if facts.secret(name):
                    hold(value)
    return keys


class _Scrubbed(io.TextIOBase):
    """A text stream that scrubs what is written to it before the stream underneath sees it."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner

    def write(self, text: str) -> int:
        self.inner.write(scrub(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:  # type: ignore[override]
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self.inner.flush()

    def isatty(self) -> bool:
        return self.inner.isatty()

    def fileno(self) -> int:
        return self.inner.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self.inner, "encoding", "utf-8"))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _ScrubRecords(logging.Filter):
    """Scrubs a log record's message before its handler formats it (a file handler too)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = scrub(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:  # the traceback, formatted here once
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text)
        return True


_RECORDS = _ScrubRecords()


def guard_output() -> None:
    """Scrub this process's stdout and stderr, and what every logging handler writes.

    Only the process's own streams are wrapped (`sys.__stdout__`, `sys.__stderr__`): a stream
    someone else put in their place (a test's capture) is left to them. Every handler there is
    (files included: Ray's worker logs) gets a filter that scrubs each record's message."""
    with _lock:
        for name in ("stdout", "stderr"):
            current = getattr(sys, name)
            if current is not None and current is getattr(sys, f"__{name}__"):
                setattr(sys, name, _Scrubbed(current))
        wrapped = {id(sys.__stdout__): sys.stdout, id(sys.__stderr__): sys.stderr}
        loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
        for logger in loggers:
            for handler in getattr(logger, "handlers", []):
                if _RECORDS not in handler.filters:
                    handler.addFilter(_RECORDS)
                stream = getattr(handler, "stream", None)
                if isinstance(handler, logging.StreamHandler) and id(stream) in wrapped:
                    replacement = wrapped[id(stream)]
                    if isinstance(replacement, _Scrubbed):
                        handler.setStream(replacement)
