"""Convert the MuSiQue source (`qa_train.json`, `train_corpus.json`: gzipped with their origin
and licence in `tests/fixtures/musique/`) into the project's JSONL layout.

Run once to regenerate the embedded sample (`python -m piserini_ray.data.musique SRC OUT`, SRC
a folder holding the two files unzipped); the output is committed under
`piserini_ray/data/sample/`. Document ids are content hashes, so the
same paragraph gets the same id on every machine and in every run.

Evidence = the question's supporting paragraphs; gold = the supporting paragraphs whose text
contains the answer or one of its aliases (case-insensitive); an empty gold set stays empty.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import orjson

from piserini_ray.errors import DataError


def musique_docid(title: str, text: str) -> str:
    """Stable id of a paragraph: a hash of its title and text."""
    return "msq-" + hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:12]


def convert_musique(src: Path, out: Path) -> dict[str, int]:
    """Write queries.jsonl, corpus.jsonl, qrels_evidence.txt, qrels_gold.txt; return counts."""
    qa = json.loads((src / "qa_train.json").read_text())
    corpus = json.loads((src / "train_corpus.json").read_text())
    ids = {(p["title"], p["text"]): musique_docid(p["title"], p["text"]) for p in corpus}
    if len(set(ids.values())) != len(ids):
        raise DataError(src / "train_corpus.json", "two paragraphs hash to the same docid")
    out.mkdir(parents=True, exist_ok=True)
    queries, evidence, gold = [], [], []
    for q in qa:
        names = [q["answer"], *q.get("answer_aliases", [])]
        for para in q["paragraphs"]:
            if not para["is_supporting"]:
                continue
            key = (para["title"], para["paragraph_text"])
            if key not in ids:
                raise DataError(src / "qa_train.json", f"paragraph of {q['id']} not in corpus")
            evidence.append(f"{q['id']} Q0 {ids[key]} 1")
            text = para["paragraph_text"].lower()
            if any(n.lower() in text for n in names if n):
                gold.append(f"{q['id']} Q0 {ids[key]} 1")
        queries.append(
            {
                "query_id": q["id"],
                "query": q["question"],
                "answer": q["answer"],
                "aliases": q.get("answer_aliases", []),
                "stratum": q["id"].split("hop", 1)[0] + "hop",  # 2hop, 3hop, 4hop
            }
        )
    with open(out / "queries.jsonl", "wb") as f:
        f.writelines(orjson.dumps(r) + b"\n" for r in queries)
    with open(out / "corpus.jsonl", "wb") as f:
        f.writelines(
            orjson.dumps(
                {"docid": ids[(p["title"], p["text"])], "title": p["title"], "text": p["text"]}
            )
            + b"\n"
            for p in corpus
        )
    (out / "qrels_evidence.txt").write_text("\n".join(evidence) + "\n")
    (out / "qrels_gold.txt").write_text("\n".join(gold) + "\n")
    return {
        "queries": len(queries),
        "documents": len(corpus),
        "evidence": len(evidence),
        "gold": len(gold),
    }


if __name__ == "__main__":
    print(convert_musique(Path(sys.argv[1]), Path(sys.argv[2])))
