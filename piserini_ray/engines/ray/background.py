"""Work on a daemon thread of its own, its result (or its error) as a future: what the driver
starts ahead of the pipeline (`bring_up`) and a replica starts in its constructor (its imports,
its searcher). A daemon, so that a process that no longer waits for it still exits."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


def on_thread(work: Callable[[], Any], name: str) -> Future[Any]:
    """Run `work` on a daemon thread named `name`; its future."""
    done: Future[Any] = Future()

    def run() -> None:
        try:
            done.set_result(work())
        except BaseException as error:  # handed to whoever waits on the future
            done.set_exception(error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return done
