"""scripts/tools/probe_needle_position.py moves only the queried needle's line."""
import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "probe_needle_position", Path(__file__).resolve().parents[2] / "scripts" / "tools" / "probe_needle_position.py")
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)

N = "One of the special magic numbers for {} is: {}."
PROMPT = "\n".join([N.format("a-b", "1111111"), N.format("c-d", "2222222"), N.format("e-f", "3333333"),
                    "The grass is green.", "What is the special magic number for c-d?"])


def test_variants_swap_the_queried_needle_only():
    lines = lambda p: p.split("\n")  # noqa: E731
    assert probe.variant(PROMPT, "2222222", "as generated") == PROMPT
    assert lines(probe.variant(PROMPT, "2222222", "first"))[:3] == [N.format("c-d", "2222222"),
                                                                   N.format("a-b", "1111111"),
                                                                   N.format("e-f", "3333333")]
    assert lines(probe.variant(PROMPT, "2222222", "last"))[:3] == [N.format("a-b", "1111111"),
                                                                  N.format("e-f", "3333333"),
                                                                  N.format("c-d", "2222222")]
    assert probe.variant(PROMPT, "2222222", "middle") == PROMPT  # already the middle needle
    for placement in probe.PLACEMENTS:  # same lines, same length
        assert sorted(lines(probe.variant(PROMPT, "2222222", placement))) == sorted(lines(PROMPT))


def test_results_without_prompts_is_a_one_line_error(tmp_path, capsys):
    f = tmp_path / "results.json"
    f.write_text('{"samples": [{"task": "niah_multikey_2", "outputs": ["1"]}]}')
    assert probe.main(["--model", str(tmp_path), "--results", str(f)]) == 2
    assert "--save-inputs" in capsys.readouterr().err


def test_missing_files_are_one_line_errors(tmp_path, capsys):
    assert probe.main(["--model", str(tmp_path / "nope"), "--results", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"error: --model: {tmp_path / 'nope'} does not exist"
    assert probe.main(["--model", str(tmp_path), "--results", str(tmp_path / "r.json")]) == 2
    assert "error: --results:" in capsys.readouterr().err
