import gzip
import hashlib
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import FIXTURES

from piserini_ray.config import BenchmarkConfig
from piserini_ray.data import Benchmark, load_benchmark, read_qrels, read_queries_jsonl
from piserini_ray.data.loaders import jsonl_corpus, sample_dir
from piserini_ray.data.musique import convert_musique, musique_docid
from piserini_ray.data.obfuscation import deobfuscate_text, obfuscate_record, obfuscate_text
from piserini_ray.errors import DataError

SMOKE = ["25", "30", "244", "549", "655", "1019", "1032", "1127", "1219"]


# ---------------------------------------------------------------- embedded sample


def test_sample_has_the_documented_shape(sample: Benchmark) -> None:
    assert len(sample.queries) == 100
    assert sum(1 for _ in sample.corpus) == 1890
    assert sum(len(v) for v in sample.evidence.values()) == 237
    assert sum(len(v) for v in sample.gold.values()) == 110
    assert all(set(sample.gold[q]) <= set(sample.evidence[q]) for q in sample.gold)
    first = sample.query("2hop__150763_14904")
    assert first.answer == "G. Stanley Hall" and first.aliases == ("Stanley Hall",)
    assert {q.stratum for q in sample.queries} == {"2hop", "3hop", "4hop"}


def test_sample_docids_are_content_hashes() -> None:
    # Pinned: the same paragraph has this id on every machine and in every run.
    assert musique_docid("Journal of Psychotherapy Integration", "x") == "msq-578a7f878acc"
    docs = {d.docid: d for d in jsonl_corpus(sample_dir() / "corpus.jsonl")}
    assert all(musique_docid(d.title or "", d.text) == i for i, d in docs.items())
    assert docs["msq-7976b1e35e0a"].title == "Journal of Psychotherapy Integration"


def test_shipped_sample_is_reproducible_from_the_source(tmp_path: Path) -> None:
    """The sample converts again from its source as published (`tests/fixtures/musique/`,
    gzipped, with its origin, licence and SHA-256s in SOURCE.md)."""
    source = FIXTURES / "musique"
    notes = (source / "SOURCE.md").read_text()
    assert "CC BY 4.0" in notes and "e1012d39" in notes
    src = tmp_path / "src"
    src.mkdir()
    for name in ("qa_train.json", "train_corpus.json"):
        data = gzip.decompress((source / f"{name}.gz").read_bytes())
        assert f"`{name}`: `{hashlib.sha256(data).hexdigest()}`" in notes, name
        (src / name).write_bytes(data)
    out = tmp_path / "out"
    counts = convert_musique(src, out)
    assert counts == {"queries": 100, "documents": 1890, "evidence": 237, "gold": 110}
    for name in ("queries.jsonl", "corpus.jsonl", "qrels_evidence.txt", "qrels_gold.txt"):
        assert (out / name).read_bytes() == (sample_dir() / name).read_bytes(), name


def test_sample_ships_its_attribution() -> None:
    text = (sample_dir() / "ATTRIBUTION.md").read_text()
    assert "CC BY 4.0" in text and "MuSiQue" in text


# ---------------------------------------------------------------- qrels


def test_browsecomp_plus_qrels_fixture() -> None:
    evidence = read_qrels(FIXTURES / "browsecomp-plus" / "qrel_evidence.txt")
    gold = read_qrels(FIXTURES / "browsecomp-plus" / "qrel_golds.txt")
    assert len(evidence) == 830 and len(gold) == 830
    assert sum(len(v) for v in evidence.values()) == 5064
    assert sum(len(v) for v in gold.values()) == 2407
    assert set(SMOKE) <= set(evidence)
    assert round(sum(len(v) for v in evidence.values()) / 830, 1) == 6.1
    assert round(sum(len(v) for v in gold.values()) / 830, 1) == 2.9


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("1 Q0 d1 1\n2 Q0 d2\n", r"bad\.txt:2: expected 4 columns"),
        ("1 Q0 d1 yes\n", r"bad\.txt:1: relevance 'yes' is not an integer"),
    ],
)
def test_qrels_errors_name_file_line_and_problem(
    tmp_path: Path, content: str, problem: str
) -> None:
    path = tmp_path / "bad.txt"
    path.write_text(content)
    with pytest.raises(DataError, match=problem):
        read_qrels(path)


# ---------------------------------------------------------------- JSONL loader


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ('{"query_id": "1", "query": "q", "answer": "a"}\n{oops\n', r"q\.jsonl:2: not valid JSON"),
        ('{"query_id": "1", "query": "q"}\n', r"q\.jsonl:1: answer: Field required"),
        ("[1, 2]\n", r"q\.jsonl:1: expected a JSON object, found list"),
        ('{"query_id": "", "query": "q", "answer": "a"}\n', r"q\.jsonl:1: query_id"),
        ("\n\n", r"q\.jsonl: query file holds no queries"),
    ],
)
def test_query_loader_errors(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text(content)
    with pytest.raises(DataError, match=problem):
        read_queries_jsonl(path)


def test_corpus_loader_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"docid": "d1", "text": "ok"}\n\n{"docid": "d2"}\n')
    with pytest.raises(DataError, match=r"c\.jsonl:3: text: Field required"):
        list(jsonl_corpus(path))


def test_missing_and_non_utf8_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope\.jsonl: corpus file does not exist"):
        jsonl_corpus(tmp_path / "nope.jsonl")
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"query_id": "1", "query": "caf\xe9", "answer": "a"}\n')
    with pytest.raises(DataError, match=r"latin1\.jsonl: not UTF-8"):
        read_queries_jsonl(path)


def test_users_own_jsonl_benchmark(tmp_path: Path) -> None:
    (tmp_path / "q.jsonl").write_text('{"query_id": 7, "query": "who?", "answer": "me"}\n')
    (tmp_path / "c.jsonl").write_text('{"docid": 3, "text": "hello", "extra": 1}\n')
    (tmp_path / "ev.txt").write_text("7 Q0 3 1\n")
    bench = load_benchmark(
        BenchmarkConfig(
            source="jsonl",
            name="mine",
            queries=tmp_path / "q.jsonl",
            corpus=tmp_path / "c.jsonl",
            qrels_evidence=tmp_path / "ev.txt",
        )
    )
    assert bench.name == "mine" and bench.query("7").answer == "me"
    assert [d.docid for d in bench.corpus] == ["3"]
    assert bench.evidence == {"7": {"3": 1}} and bench.gold == {}


def test_duplicate_query_ids_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text('{"query_id": "1", "query": "q", "answer": "a"}\n' * 2)
    with pytest.raises(DataError, match="appears twice"):
        Benchmark("b", read_queries_jsonl(path), {}, {}, jsonl_corpus(path))


# ---------------------------------------------------------------- slices


def test_slices(sample: Benchmark, tmp_path: Path) -> None:
    assert len(sample.select()) == 100
    ids = ["3hop1__404363_705261_126049", "2hop__150763_14904"]
    assert [q.query_id for q in sample.select(ids=ids)] == ids
    id_file = tmp_path / "ids.txt"
    id_file.write_text(
        "# two ids\n2hop__150763_14904\n\n3hop1__404363_705261_126049, 2hop__150763_14904\n"
    )
    assert [q.query_id for q in sample.select(ids_file=id_file)] == [ids[1], ids[0]]
    with pytest.raises(DataError, match=r"1 query id\(s\) not in benchmark.*nope"):
        sample.select(ids=["nope"])


def test_seeded_stratified_sample(sample: Benchmark) -> None:
    a = sample.select(sample=20, seed=1)
    assert a == sample.select(sample=20, seed=1)
    assert a != sample.select(sample=20, seed=2)
    assert len(a) == 20 and len({q.query_id for q in a}) == 20
    strata = [q.stratum for q in a]
    # 68 / 27 / 5 two-, three- and four-hop questions -> 14 / 5 / 1 of 20 (largest remainder).
    assert (strata.count("2hop"), strata.count("3hop"), strata.count("4hop")) == (14, 5, 1)
    order = [q.query_id for q in sample.queries]
    assert [order.index(q.query_id) for q in a] == sorted(order.index(q.query_id) for q in a)


# ---------------------------------------------------------------- BrowseComp-Plus


CANARY = "test canary: not the dataset's real one"


def _bcp_rows() -> list[dict]:
    return [
        {
            "query_id": "25",
            "query": "Which city hosted the 1900 exposition?",
            "answer": "Paris",
            "evidence_docs": [{"docid": "101", "text": "Paris hosted...", "url": "u"}],
            "gold_docs": [{"docid": "101", "text": "Paris hosted...", "url": "u"}],
        },
        {
            "query_id": "30",
            "query": "Ünïcode question?",
            "answer": "東京",
            "evidence_docs": [
                {"docid": "7", "text": "t", "url": "u"},
                {"docid": "8", "text": "t", "url": "u"},
            ],
            "gold_docs": [],
        },
    ]


def test_obfuscation_round_trip() -> None:
    for text in ["", "a", "x" * 100, "Ünïcode 東京 🎉"]:
        assert deobfuscate_text(obfuscate_text(text, CANARY), CANARY) == text
    assert obfuscate_text("Paris", CANARY) != obfuscate_text("Paris", CANARY + "!")


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_browsecomp_plus_loader_deobfuscates(tmp_path: Path, suffix: str) -> None:
    rows = [obfuscate_record(r, CANARY) for r in _bcp_rows()]
    assert rows[0]["query_id"] == "25" and rows[0]["answer"] != "Paris"
    queries, corpus = tmp_path / f"queries{suffix}", tmp_path / f"corpus{suffix}"
    docs = [{"docid": "101", "text": "Paris hosted it", "url": "http://x"}]
    if suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), queries)
        pq.write_table(pa.Table.from_pylist(docs), corpus)
    else:
        queries.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        corpus.write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in docs))
    cfg = BenchmarkConfig(source="browsecomp-plus", queries=queries, corpus=corpus, canary=CANARY)
    bench = load_benchmark(cfg)
    assert [(q.query_id, q.query, q.answer) for q in bench.queries] == [
        (r["query_id"], r["query"], r["answer"]) for r in _bcp_rows()
    ]
    assert bench.evidence == {"25": {"101": 1}, "30": {"7": 1, "8": 1}}
    assert bench.gold == {"25": {"101": 1}, "30": {}}
    assert [(d.docid, d.url) for d in bench.corpus] == [("101", "http://x")]

    # Qrels files take precedence over the doc lists in the rows.
    qrels = FIXTURES / "browsecomp-plus" / "qrel_evidence.txt"
    bench = load_benchmark(cfg.model_copy(update={"qrels_evidence": qrels}))
    assert len(bench.evidence) == 830

    wrong = cfg.model_copy(update={"canary": "wrong canary"})
    with pytest.raises(DataError, match=rf"queries{suffix}:1: cannot de-obfuscate.*canary"):
        load_benchmark(wrong)


def test_browsecomp_plus_plain_file_with_obfuscated_flag_fails_clearly(tmp_path: Path) -> None:
    queries = tmp_path / "q.jsonl"
    queries.write_bytes(orjson.dumps(_bcp_rows()[0]) + b"\n")
    cfg = BenchmarkConfig(source="browsecomp-plus", queries=queries, corpus=queries, canary=CANARY)
    with pytest.raises(DataError, match=r"q\.jsonl:1: cannot de-obfuscate: not base64"):
        load_benchmark(cfg)
    plain = load_benchmark(cfg.model_copy(update={"obfuscated": False}))
    assert plain.queries[0].answer == "Paris"


def test_damaged_parquet(tmp_path: Path) -> None:
    path = tmp_path / "q.parquet"
    path.write_bytes(b"not parquet at all")
    cfg = BenchmarkConfig(source="browsecomp-plus", queries=path, corpus=path, obfuscated=False)
    with pytest.raises(DataError, match=r"q\.parquet: not a readable parquet file"):
        load_benchmark(cfg)
