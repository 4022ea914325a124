"""Starting Ray in the background and letting it go (`engines/ray/ray_env.py`), each in a fresh
process: these tests start and end Ray instances of their own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import orjson
import pytest
from signal_owner import SIGSEGV_OWNER


def _run(script: str, env: dict[str, str] | None = None) -> dict[str, object]:
    """Run `script` in a new interpreter (in `env`, else this one's); it prints one JSON
    object last."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = orjson.loads(done.stdout.strip().splitlines()[-1])
    result["stderr"] = done.stderr
    return result


def test_ray_started_in_the_background_keeps_running_and_keeps_our_sigterm_handler() -> None:
    # Ray's processes die with the thread that started them (PR_SET_PDEATHSIG follows threads):
    # a start thread that ended after ray.init left a Ray whose GCS was gone.
    result = _run(
        """
        import json, os, signal
        from piserini_ray.config import RuntimeConfig
        from piserini_ray.engines.ray.ray_env import release_ray_async, start_ray_async

        def ours(signum, frame):
            pass

        signal.signal(signal.SIGTERM, ours)
        start_ray_async(RuntimeConfig(num_cpus=1, object_store_mb=100)).result()
        import ray

        @ray.remote
        def square(x):
            return x * x

        squares = ray.get([square.remote(i) for i in range(4)], timeout=120)
        alive = sum(1 for n in ray.nodes() if n["Alive"])
        handler_kept = signal.getsignal(signal.SIGTERM) is ours
        release_ray_async().join()
        print(json.dumps({
            "squares": squares, "alive": alive, "handler_kept": handler_kept,
            "after_release": ray.is_initialized(),
        }))
        """
    )
    assert result["squares"] == [0, 1, 4, 9] and result["alive"] == 1
    assert result["handler_kept"] is True
    assert result["after_release"] is False
    assert "SIGTERM handler is not set" not in str(result["stderr"])


def test_a_jvm_actor_on_a_ray_started_without_the_jvm_safe_setting_leaves_sigsegv_to_the_jvm():
    # JVM actors carry no runtime env (so they take the workers Ray pre-started, on a cluster
    # too): on a node whose Ray was started without RAY_DISABLE_FAILURE_SIGNAL_HANDLER, Ray's
    # handler holds SIGSEGV when the worker starts; the JVM booted after it must go in front,
    # and survive its own SIGSEGVs (null checks in compiled code: NPEs by the thousand).
    env = {k: v for k, v in os.environ.items() if k != "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"}
    result = _run(
        f"""
        import json, os
        import ray

        ray.init(
            address="local", num_cpus=1, object_store_memory=100 * 2**20,
            include_dashboard=False, log_to_driver=False,
        )

        @ray.remote
        class JvmActor:
            def probe(self):
                exec({SIGSEGV_OWNER!r}, globals())
                before = sigsegv_owner()
                from piserini_ray.retrieval.jvm import boot_jvm
                boot_jvm("256m")
                booted = sigsegv_owner()
                import jnius
                text = jnius.autoclass("java.lang.String")("abc")
                npes = 0
                for _ in range(20000):
                    try:
                        text.compareTo(None)
                    except jnius.JavaException:
                        npes += 1
                setting = os.environ.get("RAY_DISABLE_FAILURE_SIGNAL_HANDLER")
                return [setting, before, booted, npes, sigsegv_owner()]

        print(json.dumps({{"probe": ray.get(JvmActor.remote().probe.remote(), timeout=240)}}))
        ray.shutdown()
        """,
        env,
    )
    setting, before, booted, npes, after = result["probe"]  # type: ignore[misc]
    assert setting is None and before == "_raylet.so"  # Ray's handler held it
    assert booted == after == "libjvm.so" and npes == 20000


def test_a_program_that_imported_ray_first_gets_a_local_ray_that_admits_its_driver() -> None:
    # Ray reads its settings when it is imported: a notebook's `import ray` before the run
    # left it with token auth off, and the instance the run started (token auth on) refused
    # its own driver ("Failed to start GCS ... InvalidAuthToken").
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    result = _run(
        """
        import json
        import ray  # first, with no Ray setting in the environment
        from piserini_ray.config import RuntimeConfig
        from piserini_ray.engines.ray.ray_env import release_ray_async, start_ray

        start_ray(RuntimeConfig(num_cpus=1, object_store_mb=100))

        @ray.remote
        def square(x):
            return x * x

        squares = ray.get([square.remote(i) for i in range(3)], timeout=120)
        release_ray_async().join()
        print(json.dumps({"squares": squares}))
        """,
        env,
    )
    assert result["squares"] == [0, 1, 4]


@pytest.mark.parametrize("dashboard", [False, True])
def test_a_local_ray_without_the_dashboard_starts_only_what_a_run_uses(dashboard: bool) -> None:
    # Ray starts its API server (the dashboard's head process) even with the dashboard off,
    # and ray.init waits for it; its autoscaler monitor, which ray.shutdown waits a second
    # for; and a full dashboard agent, which the raylet waits for: seconds of a 2-core
    # machine's start and end for nothing a run uses.
    result = _run(
        f"""
        import json
        import ray
        from piserini_ray.config import RuntimeConfig
        from piserini_ray.engines.ray.ray_env import release_ray_async, start_ray

        start_ray(RuntimeConfig(num_cpus=1, object_store_mb=100, dashboard={dashboard}))
        node = ray._private.worker._global_node
        started = sorted(node.all_processes)
        raylet = node.all_processes["raylet"][0].process.pid
        with open(f"/proc/{{raylet}}/environ", "rb") as file:
            environ = dict(
                item.decode().split("=", 1) for item in file.read().split(b"\\0") if b"=" in item
            )
        with open(f"/proc/{{raylet}}/cmdline", "rb") as file:
            raylet_command = file.read().decode(errors="replace")
        from ray._private import node as node_module, services, utils
        from piserini_ray.engines.ray.ray_env import _await_registration

        # What the lean start waits on instead of Ray's once-a-second question.
        registered = [
            _await_registration(node.gcs_address, node.node_id),
            _await_registration(node.gcs_address, "f" * len(node.node_id), patience=0.2),
        ]

        @ray.remote
        class Echo:
            def echo(self, x):
                return x

        echoed = ray.get(Echo.remote().echo.remote("up"), timeout=120)
        restored = [
            f"{{function.__module__}}.{{function.__qualname__}}"
            for function in (
                services.start_api_server,
                node_module.Node.start_monitor,
                utils.get_dashboard_dependency_error,
                services.get_node,
            )
        ]
        release_ray_async().join()
        print(json.dumps({{
            "started": started,
            "echoed": echoed,
            "restored": restored,
            "connect": [
                environ.get("RAY_raylet_client_connect_timeout_milliseconds"),
                environ.get("RAY_raylet_client_num_connect_attempts"),
            ],
            "minimal_agent": "--minimal" in raylet_command,
            "registered": registered,
        }}))
        """
    )
    assert result["echoed"] == "up"
    assert ("dashboard" in result["started"]) is dashboard, result["started"]
    assert ("monitor" in result["started"]) is dashboard, result["started"]
    assert result["minimal_agent"] is not dashboard  # the raylet starts the agent so
    assert "raylet" in result["started"] and "gcs_server" in result["started"]
    # Ray's own functions again once Ray is up
    assert result["restored"] == [
        "ray._private.services.start_api_server",
        "ray._private.node.Node.start_monitor",
        "ray._private.utils.get_dashboard_dependency_error",
        "ray._private.services.get_node",
    ]
    assert result["connect"] == ["100", "100"]  # the raylet retries its store's socket quickly
    assert result["registered"] == [True, False]  # its node found; a node never started, not


def test_another_ray_starts_the_plain_way_and_says_so_once() -> None:
    """The lean start replaces private functions of Ray 2.60 only: a Ray that says it is
    another version starts as Ray starts itself (its monitor and API server too), with Ray's
    functions never touched, and the driver is told once."""
    result = _run(
        """
        import json
        import ray
        from ray._private import node as node_module, services, utils
        from piserini_ray.config import RuntimeConfig
        from piserini_ray.engines.ray import ray_env

        ray.__version__ = "2.61.0"  # what a newer Ray says of itself
        originals = [services.start_api_server, node_module.Node.start_monitor,
                     utils.get_dashboard_dependency_error, services.get_node]
        touched = []
        for owner, name in ((services, "start_api_server"), (services, "get_node")):
            original = getattr(owner, name)
            def watch(*args, _original=original, _name=name, **kwargs):
                touched.append(_name)  # Ray's own function was called: not replaced
                return _original(*args, **kwargs)
            setattr(owner, name, watch)
        said = []
        ray_env.start_ray(RuntimeConfig(num_cpus=1, object_store_mb=100), said.append)
        started = sorted(ray._private.worker._global_node.all_processes)
        ray_env.release_ray_async().join()
        ray_env.lean_start_applies("2.61.0", said.append)  # a second start: not said again
        print(json.dumps({
            "started": started,
            "touched": sorted(set(touched)),
            "said": [m for m in said if "plain way" in m],
        }))
        """
    )
    assert "monitor" in result["started"] and "raylet" in result["started"], result["started"]
    assert result["touched"] == ["get_node", "start_api_server"]
    (said,) = result["said"]
    assert "Ray 2.61.0 is not the Ray 2.60.0" in said and "ray==2.60.0" in said


def test_a_ray_the_caller_started_is_neither_restarted_nor_let_go() -> None:
    result = _run(
        """
        import json
        import ray
        from piserini_ray.config import RuntimeConfig
        from piserini_ray.engines.ray.ray_env import release_ray_async, start_ray, start_ray_async

        ray.init(address="local", num_cpus=1, object_store_memory=100 * 2**20,
                 include_dashboard=False)
        node = ray.get_runtime_context().get_node_id()
        start_ray(RuntimeConfig(num_cpus=2))  # already up: nothing starts
        same = ray.get_runtime_context().get_node_id() == node
        cpus = ray.cluster_resources()["CPU"]
        released = release_ray_async()
        print(json.dumps({
            "same": same, "cpus": cpus, "released": released is not None,
            "up": ray.is_initialized(), "future_done": start_ray_async(RuntimeConfig()).done(),
        }))
        """
    )
    assert result == {
        "same": True,
        "cpus": 1.0,
        "released": False,
        "up": True,
        "future_done": True,
        "stderr": result["stderr"],
    }


def test_a_config_mistake_stops_the_ray_engine_before_ray_starts(tmp_path) -> None:
    result = _run(
        f"""
        import json, sys
        from piserini_ray.config import load_config
        from piserini_ray.errors import ConfigError
        from piserini_ray.pipeline import run_on_ray

        config = load_config(None, {{
            "model.api_key_env": "PISERINI_TEST_KEY_NEVER_SET", "runtime.runs_root": "{tmp_path}",
        }})
        try:
            run_on_ray([(config, None)], print)
        except ConfigError as error:
            print(json.dumps({{"error": str(error), "ray": "ray" in sys.modules}}))
        """
    )
    assert "PISERINI_TEST_KEY_NEVER_SET, which is not set" in str(result["error"])
    assert result["ray"] is False  # not even imported
    assert not list(tmp_path.iterdir())


#: A stranger on the machine: another HOME (so no ~/.ray/auth_token of the driver's), no
#: token variables; it tries to join the Ray at argv[1].
STRANGER = """
import sys
import ray
try:
    ray.init(address=sys.argv[1], log_to_driver=False)
    print("JOINED", ray.cluster_resources().get("CPU"), flush=True)
except Exception as error:
    print("REFUSED", type(error).__name__, flush=True)
"""


def test_a_process_without_the_token_cannot_join_the_ray_a_run_started(tmp_path) -> None:
    # Ray 2.59+ turns token auth on for a new local ray.init(); a run used to switch it off
    # (RAY_AUTH_MODE=disabled), and any process of any user could then join and run code
    # as the driver's user.
    stranger = tmp_path / "stranger.py"
    stranger.write_text(STRANGER)
    home, driver_home = tmp_path / "home", tmp_path / "driver-home"
    home.mkdir()
    # The driver as a user starts it: no RAY_AUTH_* of the test session's, its own HOME.
    driver = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    result = _run(
        f"""
        import json, os, stat, subprocess, sys
        from piserini_ray.config import RuntimeConfig
        from piserini_ray.engines.ray.ray_env import release_ray_async, start_ray_async

        start_ray_async(RuntimeConfig(num_cpus=1, object_store_mb=100)).result()
        import ray

        address = ray.get_runtime_context().gcs_address
        env = {{k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}}
        env["HOME"] = {str(home)!r}
        env["RAY_gcs_server_port_wait_time_s"] = "2"  # two attempts: the Ray is up
        # (A stranger that also sets RAY_AUTH_MODE=disabled is refused on the two-host kit:
        # tests/engines/ray/test_real_cluster.py.)
        done = subprocess.run(
            [sys.executable, {str(stranger)!r}, address], env=env,
            capture_output=True, text=True, timeout=240,
        )
        tried = [done.stdout.strip().splitlines()[-1:] or [done.stderr[-300:]]]

        @ray.remote
        def square(x):
            return x * x

        squares = ray.get([square.remote(i) for i in range(3)], timeout=120)
        token = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
        mode = stat.S_IMODE(os.stat(token).st_mode)
        auth = os.environ["RAY_AUTH_MODE"]
        release_ray_async().join()
        print(json.dumps({{"tried": tried, "squares": squares, "mode": mode, "auth": auth}}))
        """,
        env=driver | {"HOME": str(driver_home)},
    )
    for attempt in result["tried"]:
        assert "JOINED" not in str(attempt) and "REFUSED" in str(attempt), result
    assert result["squares"] == [0, 1, 4]  # the run's own Ray works on
    assert result["auth"] == "token" and result["mode"] == 0o600


def test_a_token_file_is_created_private_and_a_readable_one_made_private(
    tmp_path, monkeypatch
) -> None:
    from piserini_ray.engines.ray.ray_env import ensure_private_token

    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH")
    made = ensure_private_token()
    assert made == tmp_path / ".ray" / "auth_token"
    assert made.stat().st_mode & 0o777 == 0o600 and len(made.read_text()) == 64
    made.chmod(0o644)
    before = made.read_text()
    assert ensure_private_token() == made
    assert made.stat().st_mode & 0o777 == 0o600 and made.read_text() == before


def test_token_auth_switched_off_in_the_environment_is_refused(monkeypatch) -> None:
    from piserini_ray.engines.ray.ray_env import ensure_private_token
    from piserini_ray.errors import ConfigError

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with pytest.raises(ConfigError, match=r"RAY_AUTH_MODE=disabled.*Unset RAY_AUTH_MODE"):
        ensure_private_token()


def test_workers_ray_prestarts_load_the_model_client_and_workers_started_for_a_job_do_not() -> None:
    # litellm's import (seconds of CPU) was paid by every replica at its start, on every node
    # at once; the workers a node pre-starts at `ray start` now load it while the cluster is
    # idle (`warm.py`), and the ones Ray starts for a job's light actor (the driver's node's
    # services) load nothing: before, each light actor paid a runtime env of its own (Ray's
    # setup_worker, about 0.6 s of CPU more) to stay cold.
    result = _run(
        """
        import json, os, sys, time
        from pathlib import Path
        os.environ["RAY_enable_worker_prestart"] = "1"  # as cluster.yaml's `ray start` sets
        os.environ["RAY_preload_python_modules"] = "piserini_ray.warm"
        from piserini_ray.config import RuntimeConfig
        from piserini_ray.engines.ray.ray_env import release_ray_async, start_ray

        start_ray(RuntimeConfig(num_cpus=1, object_store_mb=100))
        import ray
        from piserini_ray.engines.ray.driver_services import DriverServices

        node = ray._private.worker._global_node
        raylet = node.all_processes["raylet"][0].process.pid

        def idle_worker():  # this raylet's, registered with it (its title is set then)
            for proc in Path("/proc").iterdir():
                try:
                    parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                    if parent == raylet and (proc / "cmdline").read_bytes().startswith(
                        b"ray::IDLE"
                    ):
                        return True
                except (OSError, ValueError, IndexError):
                    continue
            return False

        deadline = time.monotonic() + 120
        while not idle_worker() and time.monotonic() < deadline:
            time.sleep(0.1)

        @ray.remote
        class Probe:
            def __init__(self):
                self.loaded = "litellm" in sys.modules  # before this actor imports anything

            def seen(self):
                return self.loaded, os.environ.get("RAY_JOB_ID")

        first = Probe.remote()  # the node's one CPU: the pre-started worker
        prestarted = ray.get(first.seen.remote(), timeout=240)
        for_the_job = ray.get(Probe.options(num_cpus=0).remote().seen.remote(), timeout=240)
        light = [DriverServices._default_options.get("runtime_env")]
        release_ray_async().join()
        print(json.dumps({"prestarted": prestarted, "for_the_job": for_the_job,
                          "light": light, "driver": "litellm" in sys.modules}))
        """
    )
    assert result["prestarted"] == [True, "ffffffff"]
    loaded, job = result["for_the_job"]
    assert loaded is False and job != "ffffffff"
    assert result["light"] == [None]  # no runtime env of its own
    assert result["driver"] is False  # the driver never loads it for the setting's sake


def test_the_warm_modules_load_only_where_ray_preloads_them_in_a_prestarted_worker(
    monkeypatch,
) -> None:
    from piserini_ray import warm

    monkeypatch.delenv("RAY_JOB_ID", raising=False)
    monkeypatch.setattr(sys, "argv", ["default_worker.py", "--worker-preload-modules=numpy"])
    assert warm.preloading() is False and warm.load() == []
    flag = "--worker-preload-modules=numpy,piserini_ray.warm"
    monkeypatch.setattr(sys, "argv", ["default_worker.py", flag])
    assert warm.preloading() is True
    monkeypatch.setenv("RAY_JOB_ID", "02000000")
    assert warm.prestarted() is False and warm.load() == []  # started for a job's actor
    monkeypatch.setenv("RAY_JOB_ID", "ffffffff")
    assert warm.prestarted() is True and warm.load() == [*warm.MODULES, *warm.FIRST_CALL]
