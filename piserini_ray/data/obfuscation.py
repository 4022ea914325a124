"""BrowseComp-Plus field obfuscation (docs/spec.md §1).

A field is base64(plaintext XOR key), where key is the SHA-256 digest of the dataset's canary
string repeated to the ciphertext's length. XOR is its own inverse, so `obfuscate` exists for
tests and for users who re-publish derived files.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable
from typing import Any

#: Fields never obfuscated in the published query rows.
CLEAR_KEYS = frozenset({"query_id"})


class DeobfuscationError(ValueError):
    """A field did not decode: wrong canary, or the file is not obfuscated."""


def _keystream(canary: str, length: int) -> bytes:
    digest = hashlib.sha256(canary.encode("utf-8")).digest()
    reps, rest = divmod(length, len(digest))
    return digest * reps + digest[:rest]


def _xor(data: bytes, canary: str) -> bytes:
    key = _keystream(canary, len(data))
    return (int.from_bytes(data, "big") ^ int.from_bytes(key, "big")).to_bytes(len(data), "big")


def deobfuscate_text(ciphertext_b64: str, canary: str) -> str:
    try:
        raw = base64.b64decode(ciphertext_b64, validate=True)
    except (binascii.Error, ValueError) as e:
        raise DeobfuscationError("not base64: the field is not obfuscated") from e
    try:
        return _xor(raw, canary).decode("utf-8")
    except UnicodeDecodeError as e:
        raise DeobfuscationError("decoded bytes are not UTF-8: the canary is wrong") from e


def obfuscate_text(plaintext: str, canary: str) -> str:
    return base64.b64encode(_xor(plaintext.encode("utf-8"), canary)).decode("ascii")


def _map_strings(obj: Any, fn: Callable[[str], str], clear_keys: frozenset[str]) -> Any:
    if isinstance(obj, str):
        return fn(obj)
    if isinstance(obj, list | tuple):
        return [_map_strings(v, fn, clear_keys) for v in obj]
    if isinstance(obj, dict):
        return {
            k: v if k in clear_keys else _map_strings(v, fn, clear_keys) for k, v in obj.items()
        }
    return obj


def deobfuscate_record(obj: Any, canary: str, clear_keys: frozenset[str] = CLEAR_KEYS) -> Any:
    """De-obfuscate every string inside `obj` except the values of `clear_keys`."""
    return _map_strings(obj, lambda s: deobfuscate_text(s, canary), clear_keys)


def obfuscate_record(obj: Any, canary: str, clear_keys: frozenset[str] = CLEAR_KEYS) -> Any:
    return _map_strings(obj, lambda s: obfuscate_text(s, canary), clear_keys)
