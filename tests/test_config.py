from pathlib import Path

import pytest

from piserini_ray.config import BM25Params, RunConfig, load_config
from piserini_ray.errors import ConfigError


def test_defaults_are_the_papers_settings() -> None:
    cfg = RunConfig()
    assert cfg.retrieval.bm25 == BM25Params(k1=25.0, b=1.0)
    assert cfg.retrieval.depth == 1000
    assert cfg.retrieval.jvm_heap == "1g"
    assert cfg.benchmark.source == "sample"
    assert (cfg.tools.first_page, cfg.tools.browse_offset, cfg.tools.browse_limit) == (5, 6, 10)
    assert (cfg.tools.doc_offset, cfg.tools.doc_limit, cfg.tools.cache_size) == (1, 200, 32)


def test_preset_sets_bm25() -> None:
    cfg = load_config(None, {"retrieval.preset": "pyserini-default"})
    assert cfg.retrieval.bm25 == BM25Params(k1=0.9, b=0.4)


def test_unknown_preset_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="pyserini-default"):
        load_config(None, {"retrieval.preset": "bogus"})


def test_unknown_key_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("retrieval:\n  detph: 10\n")
    with pytest.raises(ConfigError, match=r"c\.yaml.*detph"):
        load_config(path)


def test_relative_paths_resolve_against_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("benchmark:\n  source: jsonl\n  queries: q.jsonl\n  corpus: /abs/c.jsonl\n")
    cfg = load_config(path)
    assert cfg.benchmark.queries == tmp_path / "q.jsonl"
    assert cfg.benchmark.corpus == Path("/abs/c.jsonl")


def test_browsecomp_plus_requires_the_canary_when_obfuscated() -> None:
    over = {"benchmark.source": "browsecomp-plus", "benchmark.queries": "q.parquet"}
    over["benchmark.corpus"] = "c.parquet"
    with pytest.raises(ConfigError, match=r"benchmark\.canary is required"):
        load_config(None, over)
    assert load_config(None, over | {"benchmark.obfuscated": False}).benchmark.canary is None


def test_jsonl_source_names_missing_paths() -> None:
    with pytest.raises(ConfigError, match=r"benchmark\.queries and benchmark\.corpus"):
        load_config(None, {"benchmark.source": "jsonl"})


def test_bad_yaml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_bad_heap_value() -> None:
    with pytest.raises(ConfigError, match="jvm_heap"):
        load_config(None, {"retrieval.jvm_heap": "lots"})


def _checkout(root: Path, comment: str = "") -> Path:
    """A config and its data files laid out as in a checkout under `root`."""
    (root / "data").mkdir(parents=True)
    (root / "data" / "queries.jsonl").write_text('{"query_id": "1", "query": "q", "answer": "a"}\n')
    (root / "data" / "corpus.jsonl").write_text('{"docid": "d1", "text": "hello"}\n')
    (root / "configs").mkdir()
    path = root / "configs" / "mine.yaml"
    path.write_text(
        f"{comment}\nbenchmark:\n  source: jsonl\n  queries: ../data/queries.jsonl\n"
        "  corpus: ../data/corpus.jsonl\nretrieval:\n  index_root: ../indexes\n"
    )
    return path


def test_a_checkout_copied_elsewhere_names_the_same_run(tmp_path: Path) -> None:
    """A Ray job runs from a fresh copy of the working dir at a new path each time: data files
    count by content, where indexes live not at all, and comments are not config."""
    here = load_config(_checkout(tmp_path / "here"))
    there = load_config(_checkout(tmp_path / "ray_pkg_0123", comment="# edited comment"))
    assert here.benchmark.queries != there.benchmark.queries  # absolute, different places
    assert here.config_hash() == there.config_hash()
    (tmp_path / "ray_pkg_0123" / "data" / "corpus.jsonl").write_text(
        '{"docid": "d1", "text": "changed"}\n'
    )
    assert load_config(tmp_path / "ray_pkg_0123" / "configs" / "mine.yaml").config_hash() != (
        here.config_hash()
    )


def test_a_large_data_file_is_identified_by_sampled_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above the whole-file limit the identity reads 16 chunks (head and tail included), so a
    change in the last byte still counts and naming a run never reads gigabytes."""
    import piserini_ray.config as config_module

    monkeypatch.setattr(config_module, "_WHOLE_FILE_LIMIT", 1 << 20)
    monkeypatch.setattr(config_module, "_CHUNK", 1 << 12)
    big = tmp_path / "corpus.jsonl"
    big.write_bytes(b"x" * (3 << 20))
    first = config_module.file_identity(big)
    assert first.startswith(f"{3 << 20}:")
    with open(big, "r+b") as f:
        f.seek((3 << 20) - 1)
        f.write(b"y")
    assert config_module.file_identity(big) != first
    assert config_module.file_identity(tmp_path / "absent") == f"missing:{tmp_path / 'absent'}"
