"""What a config may not hold: key values, and settings that move a model's key elsewhere.

The one owner of the secret-name rule (`SECRET_NAME`): configs refuse settings so named, and
the scrubber (`llm/scrubber.py`) removes the values of environment variables so named.

`model.extra` is passed to litellm as it is, after the project's own parameters, so a setting
there wins over them. A key is chosen for the model's own endpoint (`model.api_base`,
`model.api_key_env`); an `extra` that names another endpoint, another provider route, other
credentials, headers, a proxy, a client or a callback would send that key (or the request)
somewhere the config's reader does not see. Those names are refused (`route_setting`); they are
litellm's `completion()` parameters and `kwargs` that decide where and how a request is sent or
authenticated (litellm 1.106: its signature, the `kwargs` it reads, its callback parameters
`StandardCallbackDynamicParams` and its workload-identity parameters; `tests/config/test_config.py`
checks that each of litellm's is refused, so a new one shows up there).
"""

from __future__ import annotations

import re
from typing import Any

#: Names of settings, or environment variables, that hold a secret.
SECRET_NAME = re.compile(
    r"(api_?key|^key$|_key$|token|secret|password|passwd|authorization|credential|private_key)",
    re.I,
)
#: Values shaped like a provider's key: OpenAI/Anthropic/DeepSeek `sk-...`, Google `AIza...`,
#: OpenRouter `sk-or-...`, GitHub/HF tokens, a bearer header.
KEY_VALUE = re.compile(
    r"(\bsk-[A-Za-z0-9_-]{16,}|\bAIza[0-9A-Za-z_-]{30,}|\bgh[pousr]_[A-Za-z0-9]{30,}"
    r"|\bhf_[A-Za-z0-9]{30,}|\bBearer\s+\S{12,})"
)

#: litellm parameters that choose the endpoint, the route, the credentials or the transport
#: of a request, or send it (or its key) to a callback.
ROUTE_SETTINGS = frozenset(
    {
        # where: the endpoint, the provider route, a deployment list, fallbacks to other models
        "api_base",
        "base_url",
        "custom_llm_provider",
        "azure",
        "model_list",
        "fallbacks",
        "context_window_fallback_dict",
        "model_alias_map",
        "use_litellm_proxy",
        "use_in_pass_through",
        "allm_passthrough_route",
        "litellm_credential_name",
        "region_name",
        "data_residency",
        "deployment_id",
        "api_version",
        # how: keys, identities, headers, the HTTP client and its TLS, proxies
        "api_key",
        "organization",
        "project",
        "headers",
        "extra_headers",
        "provider_specific_header",
        "provider_affinity_header",
        "configurable_clientside_auth_params",
        "client",
        "shared_session",
        "http_client",
        "ssl_verify",
        "proxy",
        "proxies",
        "client_id",
        "client_secret",
        "tenant_id",
        "azure_ad_token",
        "azure_ad_token_provider",
        "azure_username",
        "azure_password",
        "azure_scope",
        "use_xai_oauth",
        "timeout",
        "num_retries",
        "max_retries",
        # who else sees it: callbacks and loggers (they are handed the request and its key)
        "callbacks",
        "success_callback",
        "failure_callback",
        "logger_fn",
        "litellm_logging_obj",
        "litellm_trusted_callback_vars",
        "litellm_disabled_callbacks",
        "turn_off_message_logging",
        "guardrails",
        "proxy_server_request",
        "secret_fields",
    }
)
#: Families of such parameters: cloud credentials and locations (`aws_*`, `vertex_*`, ...),
#: logging services (`langfuse_*`, `dd_*`, ...), workload identities, and any name of an
#: endpoint, a header, a proxy, a callback or a credential.
ROUTE_FAMILY = re.compile(
    r"^(aws|vertex|vertexai|azure|watsonx|gcs|s3|bedrock|sagemaker|databricks|snowflake"
    r"|langfuse|langsmith|dd|arize|humanloop|newrelic|posthog|signoz|wandb|weave|otel"
    r"|anthropic_(identity|federation|issuer|keycloak|service_account|organization|disable_workload)"
    r"|openai_(identity|service_account))_"
    r"|(^|_)(base|url|uri|host|endpoint|header|headers|proxy|proxies|callback|callbacks"
    r"|credential|credentials|auth|oauth|cert|ca_bundle|verify)(_|$)",
    re.I,
)
#: What to do instead, in every refusal.
ROUTE_FIX = (
    "model.extra carries request options only (temperature-like parameters, `extra_body`); "
    "name the endpoint in model.api_base and the key's environment variable in "
    "model.api_key_env (a key is sent only to its model's own endpoint), and the route in "
    "model.litellm_model"
)


def route_setting(name: str) -> bool:
    """Whether an `extra` setting called `name` changes where or how a request is sent or
    authenticated (see the module's docstring)."""
    return name in ROUTE_SETTINGS or bool(ROUTE_FAMILY.search(name))


def key_shaped(name: str, value: Any) -> str | None:
    """Why a free-form setting called `name` with `value` looks like it holds a key, or None."""
    if not isinstance(value, str) or not value:
        return None
    if KEY_VALUE.search(value):
        return "holds a value shaped like an API key"
    if SECRET_NAME.search(name):
        return f"sets {name!r}, which names a secret"
    return None
