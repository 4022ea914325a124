"""What a model's litellm route needs, in one place: which provider route it goes through
(`openai`, `anthropic`, `deepseek`, `azure`, `bedrock`, ...), and the environment variables a
call on it reads for its credentials and endpoint (`route_facts`), which of them are secret and
which litellm parameter carries each value. The check before spending (`preflight.py`), the
keys the driver hands to its replicas and the scrubber (`llm/scrubber.py`) and the client's
call (`llm/client.py`) all ask here.

The driver asks this of every model a run serves on its loopback (`endpoints.py`) and of every
model at a half-price tier (`preflight.py`). A route written with one of `PREFIXED` in front
(`openai/gpt-5.4-mini`) is litellm's that prefix (`get_llm_provider` takes a prefix of its
provider list as the provider), answered here without importing litellm: its import is seconds
of CPU that a run's start-up would spend beside its replicas' own. Any other route asks litellm
(the tests hold the shortcut to litellm's answers).
"""

from __future__ import annotations

import functools
import os
import threading
import types
from dataclasses import dataclass
from typing import Any, ClassVar

from piserini_ray.config import ModelConfig
from piserini_ray.config.secret_rules import SECRET_NAME

#: Route prefixes litellm takes as the provider itself, unless a proxy is forced on every call
#: (`USE_LITELLM_PROXY`, litellm's `should_use_litellm_proxy_by_default`).
PREFIXED = frozenset({"openai", "anthropic"})


def route_provider(model: ModelConfig) -> str:
    """litellm's provider of the model's route; an offline model goes through the OpenAI
    route to the loopback provider; "unknown" for a route litellm does not know (its own call
    then says what is wrong)."""
    route = model.resolved_litellm_model()
    prefix, slash, rest = route.partition("/")
    if slash and rest and prefix in PREFIXED and not os.environ.get("USE_LITELLM_PROXY"):
        return prefix
    import litellm

    try:
        return str(litellm.get_llm_provider(route)[1])
    except Exception:
        return "unknown"


#: The AWS routes' ambient credentials and region. litellm's `BaseAWSLLM.get_credentials`
#: (llms/bedrock/base_aws_llm.py) falls back from each `aws_*` parameter to the variable of
#: the same name in capitals; `validate_environment` names only the first two.
AWS_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION_NAME",
)
AWS_ROUTES = frozenset({"bedrock", "sagemaker"})
#: Bedrock's runtime endpoint, when it is not AWS's own (a VPC endpoint, a gateway): litellm's
#: `get_runtime_endpoint` reads it after its `aws_bedrock_runtime_endpoint` parameter.
BEDROCK_VARIABLES = ("AWS_BEDROCK_RUNTIME_ENDPOINT",)
#: What litellm's `validate_environment` names for the routes of `PREFIXED`, answered without
#: its import like their provider (tests/llm/test_routes.py holds them to litellm's answer).
PREFIXED_VARIABLES = {"openai": ("OPENAI_API_KEY",), "anthropic": ("ANTHROPIC_API_KEY",)}
#: litellm's parameter for a variable, by the end of its name (AWS's and Vertex's have their
#: own parameters, `RouteFacts.parameter`).
_SUFFIXES = (
    ("_API_BASE", "api_base"),
    ("_API_VERSION", "api_version"),
    ("_API_KEY", "api_key"),
    ("_API_TOKEN", "api_key"),
)


@dataclass(frozen=True)
class RouteFacts:
    """A model's route and the environment variables its calls read (litellm's names), in the
    order litellm gives them."""

    provider: str
    variables: tuple[str, ...] = ()
    #: The model's own key variable (`model.api_key_env`), if it names one.
    key_env: str | None = None

    def secret(self, variable: str) -> bool:
        """Whether the variable holds a credential (scrubbed everywhere, never logged)."""
        return (
            variable == self.key_env
            or SECRET_NAME.search(variable) is not None
            or variable.endswith("_KEY_ID")
        )

    def parameter(self, variable: str) -> str | None:
        """The litellm parameter that carries the variable's value (None: litellm reads it
        from the environment only)."""
        if variable == self.key_env:
            return "api_key"
        if variable.startswith("AWS_"):  # aws_access_key_id, aws_region_name, ...
            return variable.lower()
        if variable.startswith("VERTEXAI_"):  # vertex_project, vertex_location
            return "vertex_" + variable.removeprefix("VERTEXAI_").lower()
        return next((p for suffix, p in _SUFFIXES if variable.endswith(suffix)), None)

    @property
    def key_variables(self) -> tuple[str, ...]:
        """The variables any of which may hold the `api_key` a call sends, in litellm's order
        (Gemini's route takes `GOOGLE_API_KEY` or `GEMINI_API_KEY`)."""
        return tuple(v for v in self.variables if self.parameter(v) == "api_key")


def route_facts(model: ModelConfig, api_base: str | None = None) -> RouteFacts:
    """What a call of `model` reads from the environment. An offline model, a model the run
    serves (`model.serve`) and an endpoint of the user's own (`api_base`, or
    `model.api_base`) without `model.api_key_env` read none;
    `model.api_key_env` replaces the route's own key variables."""
    if model.is_offline:
        return RouteFacts(provider="openai")
    provider = route_provider(model)
    own_endpoint = (api_base or model.api_base) is not None or model.serve is not None
    if own_endpoint and model.api_key_env is None:
        return RouteFacts(provider=provider)
    route = model.resolved_litellm_model()
    prefix = route.partition("/")[0]
    shortcut = prefix == provider and provider in PREFIXED_VARIABLES
    known = PREFIXED_VARIABLES[provider] if shortcut else _litellm_variables(route)
    if known is None and provider != "unknown":  # a route litellm's check does not know
        known = (f"{provider.upper().replace('-', '_')}_API_KEY",)
    variables = list(known or ())
    if provider in AWS_ROUTES:
        extra = AWS_VARIABLES + (BEDROCK_VARIABLES if provider == "bedrock" else ())
        variables += [v for v in extra if v not in variables]
    facts = RouteFacts(provider=provider, variables=tuple(variables))
    if model.api_key_env is not None:
        kept = [v for v in variables if not facts.secret(v)]
        if own_endpoint:
            kept = [v for v in kept if facts.parameter(v) != "api_base"]
        return RouteFacts(provider, (model.api_key_env, *kept), key_env=model.api_key_env)
    return facts


def missing_variables(model: ModelConfig) -> list[str] | None:
    """litellm's own check of this process's environment for the model's route: the variables
    it misses, None when it has what the route needs."""
    import litellm

    check = litellm.validate_environment(model=model.resolved_litellm_model())
    if check.get("keys_in_environment", True):
        return None
    return list(check.get("missing_keys") or [])


_ASKING = threading.Lock()


class _NoEnvironment(types.ModuleType):
    """`os` as litellm's `validate_environment` sees it while we ask it for a route's whole
    list: an empty environment, so that it names every variable (it names only the missing)."""

    environ: ClassVar[dict[str, str]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


@functools.cache
def _litellm_variables(route: str) -> tuple[str, ...] | None:
    """Every variable litellm's `validate_environment` wants for `route` (none: a route that
    needs none, such as a self-hosted vLLM's; None: a route its check does not know), asked
    once per route with its view of the environment empty (only litellm's `utils` module's,
    and only for the call: the process's own environment is never touched)."""
    import litellm
    import litellm.utils as litellm_utils

    with _ASKING:
        litellm_utils.os = _NoEnvironment("os")
        try:
            check = litellm.validate_environment(model=route)
        except Exception:
            return None
        finally:
            litellm_utils.os = os
    missing = tuple(dict.fromkeys(check.get("missing_keys") or []))
    return None if not missing and not check.get("keys_in_environment") else missing
