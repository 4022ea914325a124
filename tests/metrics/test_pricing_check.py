"""`piserini-ray pricing check`: the table against litellm's bundled price map."""

from pathlib import Path

from piserini_ray.cli import main
from piserini_ray.metrics.cost import load_pricing, price_differences


def test_differences_with_litellms_map_are_listed(tmp_path: Path, capsys) -> None:
    table = tmp_path / "pricing.yaml"
    table.write_text(
        "models:\n"
        "  gpt-5: {input: 1.25, output: 10, cache_read: 0.125}\n"  # as litellm has it
        "  claude-haiku-4.5: {input: 1.00, output: 6, cache_read: 0.10, cache_write: 1.25}\n"
        "  no-such-model: {input: 1, output: 1, cache_read: 1}\n"
        "  offline/heuristic: {input: 0, output: 0, cache_read: 0}\n"
    )
    found = {
        (d.model, d.field): (d.ours, d.litellm) for d in price_differences(load_pricing(table))
    }
    assert found == {
        ("claude-haiku-4.5", "output"): (6, 5),
        ("no-such-model", "model"): (None, None),
    }
    assert main(["pricing", "check", "--table", str(table)]) == 1
    out = capsys.readouterr().out
    assert "claude-haiku-4.5 output: table 6.0, litellm 5.0" in out and "2 difference(s)" in out


def test_the_shipped_table_differs_from_litellm_only_where_the_spec_does() -> None:
    """The table follows docs/spec.md §8; litellm 1.106.2's map prices DeepSeek V4 otherwise."""
    differences = price_differences(load_pricing())
    assert {d.model for d in differences} == {"deepseek-v4-flash", "deepseek-v4-pro"}
