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
