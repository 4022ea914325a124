"""The public API (`piserini_ray/__init__.py`): what a user imports, run end to end as a user
runs it, and every public name documented (arguments, returns, an example)."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import piserini_ray


def test_the_api_runs_three_sample_queries_end_to_end(
    sample_index: Path, index_root: Path, tmp_path: Path
) -> None:
    from piserini_ray import (
        Judgement,
        QueryRecord,
        Report,
        RunConfig,
        RunManifest,
        RunMetrics,
        RunSummary,
        judge,
        load_config,
        report,
        run,
    )
    from piserini_ray.data import load_benchmark

    config = load_config(overrides={"retrieval.index_root": str(index_root), "slice.sample": 3})
    assert isinstance(config, RunConfig) and config.model.name == "offline/heuristic"
    wanted = {q.query_id for q in load_benchmark(config.benchmark).select(sample=3)}
    summaries: list[RunSummary] = []
    logs: list[str] = []
    run_dir = run(
        config, tmp_path / "run", engine="local", log=logs.append, on_summary=summaries.append
    )

    assert run_dir == (tmp_path / "run").absolute()
    assert [(s.queries, s.ran_now) for s in summaries] == [(3, 3)]
    lines = (run_dir / "records.jsonl").read_text().splitlines()
    records = [QueryRecord.model_validate_json(line) for line in lines]
    assert {r.query_id for r in records} == wanted and len(records) == 3
    assert all(r.status == "completed" and r.exact_answer for r in records)
    manifest = RunManifest.model_validate_json((run_dir / "manifest.json").read_text())
    assert manifest.config_hash == config.config_hash()
    assert manifest.versions["piserini_ray"] == piserini_ray.__version__

    # The run judged its answers with its own judge, once per query, and wrote its reports.
    (verdict_file,) = (run_dir / "judgements").glob("*.jsonl")
    verdicts = [Judgement.model_validate_json(x) for x in verdict_file.read_text().splitlines()]
    assert {v.query_id for v in verdicts} == wanted
    assert all(
        v.status == "judged" and v.judge_model == config.judge_model().name for v in verdicts
    )
    summary = RunMetrics.model_validate_json((run_dir / "summary.json").read_text())
    correct = sum(bool(v.correct) for v in verdicts)
    assert summary.queries == 3 and summary.accuracy.value == pytest.approx(correct / 3)
    assert (run_dir / "report.md").is_file() and (run_dir / "report.html").is_file()

    # judge: nothing is judged again; a second judge's verdicts go beside the first's.
    judged = judge(run_dir, judges=["offline/lenient-judge"], log=logs.append)
    assert isinstance(judged, Report) and judged.metrics[0].accuracy == summary.accuracy
    assert len(verdict_file.read_text().splitlines()) == 3
    assert len(list((run_dir / "judgements").glob("*.jsonl"))) == 2
    assert len(judged.metrics[0].judge_agreement) == 1

    # report: a combined report in `out`, from the verdicts alone.
    reported = report([run_dir], out=tmp_path / "combined", log=logs.append)
    assert [p.name for p in reported.combined] == ["report.md", "report.html"]
    assert all(p.parent == tmp_path / "combined" and p.is_file() for p in reported.combined)
    assert config.model.name in reported.table

    # run again: the same run directory resumes, nothing runs again.
    assert run(config, run_dir, engine="local", log=logs.append, on_summary=summaries.append)
    assert summaries[-1].ran_now == 0
    assert (run_dir / "records.jsonl").read_text().splitlines() == lines


def test_importing_the_package_loads_no_engine_no_jvm_and_no_provider_client() -> None:
    code = (
        "import sys, piserini_ray\n"
        "from piserini_ray import load_config, run, judge, report, RunConfig\n"
        "heavy = ('ray', 'jnius', 'litellm', 'torch', 'matplotlib', 'pyserini')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_version_has_one_owner_the_package_metadata() -> None:
    from importlib.metadata import version

    assert piserini_ray.__version__ == version("piserini_ray")
    source = Path(piserini_ray.__file__).read_text()
    assert version("piserini_ray") not in source  # no second literal to drift


def _public() -> list[tuple[str, object]]:
    return [(n, getattr(piserini_ray, n)) for n in piserini_ray.__all__ if n != "__version__"]


def test_every_public_name_resolves_and_every_function_is_typed() -> None:
    for name, value in _public():
        assert getattr(value, "__name__", None) == name, name
        if inspect.isfunction(value):
            hints = inspect.get_annotations(value)
            assert "return" in hints, f"{name} has no return type"
            params = inspect.signature(value).parameters
            assert all(p in hints for p in params), f"{name}: an argument without a type"


@pytest.mark.parametrize("name", [n for n in piserini_ray.__all__ if n != "__version__"])
def test_every_public_name_is_documented_with_arguments_returns_and_an_example(name: str) -> None:
    value = getattr(piserini_ray, name)
    doc = inspect.getdoc(value) or ""
    assert doc.strip(), f"{name} has no docstring"
    for section in ("Args:", "Returns:", "Example:"):
        assert f"\n{section}\n" in f"\n{doc}\n", f"{name}'s docstring has no {section} section"
    if inspect.isfunction(value):
        args = doc.split("\nArgs:\n", 1)[1].split("\n\n", 1)[0]
        for param in inspect.signature(value).parameters:
            assert f"{param}:" in args, f"{name}'s docstring does not describe {param!r}"
    example = doc.split("\nExample:\n", 1)[1]
    assert "```python" in example and "from piserini_ray import" in example


def test_no_public_name_is_the_name_of_a_module_of_the_package() -> None:
    """`piserini_ray.report` is the function whatever was imported before: no module or package
    of `piserini_ray` has a public name's name (the import system would otherwise set the
    attribute to the submodule)."""
    package = Path(piserini_ray.__file__).parent
    modules = {p.stem for p in package.glob("*.py")} | {
        p.parent.name for p in package.glob("*/__init__.py")
    }
    assert not modules & set(piserini_ray.__all__), sorted(modules & set(piserini_ray.__all__))
    code = (
        "import piserini_ray.reports.run_metrics, piserini_ray.analysis.estimate, piserini_ray\n"
        "from piserini_ray import estimate, report\n"
        "assert callable(report) and report.__module__.startswith('piserini_ray.api'), report\n"
        "assert callable(estimate) and piserini_ray.estimate is estimate\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_cli_imports_no_engine_and_no_pipeline_at_start_up() -> None:
    """The command line reaches them only through the API, when a command needs them (the
    import-linter contract checks its imports; this, what a start-up loads)."""
    code = (
        "import sys, piserini_ray.cli\n"
        "inner = ('pipeline', 'engines', 'endpoints')\n"
        "print(sorted(m for m in inner if f'piserini_ray.{m}' in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
