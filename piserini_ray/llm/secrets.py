"""Key values never reach a record, a verdict, a log line or an error message.

litellm reads a hosted provider's key from its own variables (`OPENAI_API_KEY`,
`ANTHROPIC_API_KEY`, `DEEPSEEK_API_KEY`, ...) when `model.api_key_env` is not set, and a
provider's error may quote the key it was sent. So every value of every variable whose name
marks it as a secret is removed, beside the key a call actually sent.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from pydantic import SecretStr

from piserini_ray.config import ModelConfig

#: Variable names that hold secrets: *_API_KEY, *_KEY, *TOKEN*, *SECRET*, *PASSWORD*.
_SECRET_NAME = re.compile(r"(API_?KEY|_KEY$|^KEY$|TOKEN|SECRET|PASSWORD|CREDENTIAL)", re.I)
#: Shorter values are not keys (flags like "1" or "true") and replacing them would mangle text.
MIN_SECRET_LENGTH = 8
MASK = "***"


def secret_values(extra: Iterable[str | None] = ()) -> list[str]:
    """Every secret this process could send, longest first (a key that contains another is
    removed whole)."""
    found = {
        value
        for name, value in os.environ.items()
        if _SECRET_NAME.search(name) and len(value) >= MIN_SECRET_LENGTH
    }
    found |= {value for value in extra if value and len(value) >= 4}
    return sorted(found, key=len, reverse=True)


def scrub(text: str, extra: Iterable[str | None] = ()) -> str:
    """`text` with every secret value replaced by `***`."""
    for value in secret_values(extra):
        text = text.replace(value, MASK)
    return text


def key_variable(model: ModelConfig, api_base: str | None = None) -> str | None:
    """The environment variable that holds a model's key: `model.api_key_env`; for a hosted
    model without one, the variable litellm reads for its provider (`OPENAI_API_KEY`,
    `ANTHROPIC_API_KEY`, `GEMINI_API_KEY`, ...: `<PROVIDER>_API_KEY`); None for an endpoint of
    the user's own (`api_base`, or `model.api_base`) or an offline model: no secret."""
    if model.api_key_env is not None:
        return model.api_key_env
    if model.is_offline or (api_base or model.api_base) is not None:
        return None
    import litellm

    try:
        provider = litellm.get_llm_provider(model=model.resolved_litellm_model())[1]
    except Exception:  # an unknown route: litellm's own call says what is wrong
        return None
    return f"{str(provider).upper().replace('-', '_')}_API_KEY"


def driver_keys(models: Iterable[ModelConfig]) -> dict[str, SecretStr]:
    """The key values, read here (the driver), that the models' calls need: handed to the
    replicas with each query, in memory only (never a file, a log or a `runtime_env`), so that a
    node started without the user's environment can call the model. A variable this process
    lacks is left out: a node that has it uses its own."""
    keys = {}
    for model in models:
        name = key_variable(model)
        if name is not None and (value := os.environ.get(name)):
            keys[name] = SecretStr(value)
    return keys
