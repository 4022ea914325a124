"""Keys go only to their model's endpoint: `model.extra` may not name another endpoint, other
credentials, headers, a proxy, a client or a callback (`config/secret_rules.py`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from echo_provider import EchoProvider

from piserini_ray.config import load_config
from piserini_ray.config.secret_rules import route_setting
from piserini_ray.errors import ConfigError


def test_an_extra_that_names_another_endpoint_is_refused_before_any_request(
    tmp_path: Path,
) -> None:
    key = "canary-route-0123456789abcdef"
    with EchoProvider() as model_endpoint, EchoProvider() as other_host:
        config = tmp_path / "c.yaml"
        config.write_text(
            "model:\n"
            "  name: gpt-5\n"
            f"  api_base: '{model_endpoint.base_url}'\n"
            "  api_key_env: MY_THING\n"
            f"  extra: {{api_base: '{other_host.base_url}'}}\n"
        )
        out = subprocess.run(
            [sys.executable, "-m", "piserini_ray.cli", "run", "--check", "--config", str(config)],
            capture_output=True,
            text=True,
            env=os.environ | {"PISERINI_RAY_HOME": str(tmp_path), "MY_THING": key},
            timeout=300,
        )
    assert out.returncode == 2, out.stderr
    assert "model.extra.api_base" in out.stderr and "model.api_base" in out.stderr
    assert other_host.requests == [] and model_endpoint.requests == []


@pytest.mark.parametrize(
    "name",
    ["base_url", "api_key", "extra_headers", "headers", "organization", "custom_llm_provider",
     "aws_secret_access_key", "aws_region_name", "vertex_credentials", "vertex_project",
     "callbacks", "success_callback", "langfuse_host", "proxies", "client", "model_list",
     "azure_ad_token", "logger_fn", "ssl_verify", "timeout"],
)  # fmt: skip
def test_each_setting_that_routes_or_authenticates_is_named_in_the_error(name: str) -> None:
    with pytest.raises(ConfigError, match=f"model.extra.{name}.*model.api_key_env"):
        load_config(None, {"model.name": "gpt-5", "model.extra": {name: {"x": 1}}})


def test_request_options_stay_allowed() -> None:
    extra = {
        "top_p": 0.9,
        "extra_body": {"reasoning": {"summary": "auto"}},
        "parallel_tool_calls": False,
        "verbosity": "low",
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }
    assert load_config(None, {"model.name": "gpt-5", "model.extra": extra}).model.extra == extra


def test_every_routing_parameter_of_litellm_is_refused() -> None:
    """litellm's own lists of what routes a request, authenticates it, or hands it to a
    callback: a parameter litellm adds there shows up here, not in a user's bill."""
    import inspect

    import litellm
    from litellm.types import utils

    signature = inspect.signature(litellm.completion).parameters
    routing = {"api_base", "base_url", "api_key", "api_version", "extra_headers", "model_list",
               "deployment_id", "shared_session"}  # fmt: skip
    assert routing <= set(signature) | {"api_base"}
    names = (
        routing
        | set(utils.StandardCallbackDynamicParams.__annotations__)
        | set(utils.server_owned_wif_litellm_params)
        | set(utils.secret_bearing_wif_litellm_params)
        | {n for n in utils.all_litellm_params if n.startswith(("aws_", "vertex_", "s3_", "azure"))}
    )
    assert sorted(n for n in names if not route_setting(n)) == []
