"""scripts/real_model/long_text.py on a tiny fake package tree: one document per package (and one of a
root's top-level modules), prose apart, held-out packages never in train, the same bytes on a
second run, token counts that match the tokenizer on the whole text."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "real_model" / "long_text.py"
PACKAGES = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta")


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=300,
                          check=False)


def _source(name: str, i: int) -> str:
    return "".join(f"def {name}_{i}_{k}(x):\n    return x * {k} + {i}  # {name}\n\n\n" for k in range(40))


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """Two roots; `alpha` is in both (one package by name, on one side of the split)."""
    d = tmp_path_factory.mktemp("roots")
    for r, names in (("lib", PACKAGES), ("site", ("alpha", "tiny"))):
        root = d / r
        for name in names:
            pkg = root / name
            (pkg / "sub").mkdir(parents=True)
            (pkg / "__init__.py").write_text(_source(name, 0))
            (pkg / "sub" / "b.py").write_text(_source(name, 2) + "\n\n\n")  # trailing blank lines are cut
            (pkg / "a.py").write_text(_source(name, 1))
            (pkg / "__pycache__").mkdir()
            (pkg / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\x00\x01")
            (pkg / "README.md").write_text(f"# {name}\n\n" + "Some prose about the package. " * 60 + "\n")
            (pkg / "LICENSE.txt").write_text("Permission is hereby granted " * 10)
        (root / "alpha.dist-info").mkdir()
        (root / "alpha.dist-info" / "RECORD.py").write_text(_source("nope", 9))
    (d / "site" / "tiny" / "a.py").write_text("x = 1\n")  # `tiny` ends up below --min-chars
    (d / "site" / "tiny" / "sub" / "b.py").write_text("y = 2\n")
    (d / "site" / "tiny" / "__init__.py").write_text("")
    (d / "lib" / "mod_a.py").write_text(_source("moda", 0) * 3)
    (d / "lib" / "mod_b.py").write_text(_source("modb", 0) * 3)
    corpus = "\n".join((d / "lib" / n / "a.py").read_text() for n in PACKAGES)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator([corpus], trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel
                                                          .alphabet(), show_progress=False))
    tok.save(str(d / "tokenizer.json"))
    return d


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def written(tree):
    out = tree / "out"
    done = run(out, "--roots", tree / "lib", tree / "site", "--min-chars", 1000, "--heldout-fraction", 0.3,
               "--tokenizer", tree / "tokenizer.json")
    assert done.returncode == 0, done.stderr
    return out, done


def test_documents_per_package_disjoint_by_name(tree, written):
    out, done = written
    train, held = _rows(out / "train.jsonl"), _rows(out / "heldout.jsonl")
    manifest = json.loads((out / "manifest.json").read_text())
    assert held and train
    assert {r["package"] for r in train}.isdisjoint({r["package"] for r in held})
    assert set(manifest["heldout_packages"]) == {r["package"] for r in held}
    kinds = {(r["source"].rsplit("/", 1)[-1], r["package"], r["kind"]) for r in train + held}
    assert {("lib", n, k) for n in PACKAGES for k in ("code", "prose")} | {("lib", "(modules)", "code"),
                                                                           ("site", "alpha", "code")} <= kinds
    assert ("tiny", "code") not in {(r["package"], r["kind"]) for r in train + held}  # below --min-chars
    assert not any(r["package"].endswith("dist-info") for r in train + held)
    lib_alpha = next(r for r in train + held if r["package"] == "alpha" and r["kind"] == "code"
                     and r["source"].endswith("lib"))
    text = lib_alpha["text"]
    headers = [line for line in text.splitlines() if line.startswith("# file: ")]
    assert headers == ["# file: alpha/__init__.py", "# file: alpha/a.py", "# file: alpha/sub/b.py"]
    assert text.startswith("# file: alpha/__init__.py\n" + _source("alpha", 0).rstrip() + "\n# file: alpha/a.py\n")
    assert text.endswith(_source("alpha", 2).rstrip() + "\n")
    prose = next(r for r in train + held if r["package"] == "alpha" and r["kind"] == "prose")
    assert "Permission is hereby granted" not in prose["text"] and "Some prose" in prose["text"]
    assert "train:" in done.stdout and "heldout:" in done.stdout


def test_manifest_counts_match_rows_and_tokenizer(tree, written):
    out, _ = written
    manifest = json.loads((out / "manifest.json").read_text())
    tok = Tokenizer.from_file(str(tree / "tokenizer.json"))
    for split in ("train", "short", "heldout"):
        rows = _rows(out / f"{split}.jsonl")
        entries = manifest["documents"][split]
        assert [(e["package"], e["kind"], e["chars"]) for e in entries] == [(r["package"], r["kind"], len(r["text"]))
                                                                            for r in rows]
        for e, r in zip(entries, rows, strict=True):
            assert e["tokens"] == r["tokens"] == len(tok.encode(r["text"], add_special_tokens=False).ids)
        totals = manifest["totals"][split]
        assert totals["documents"] == len(rows)
        assert totals["chars"] == sum(len(r["text"]) for r in rows)
        assert totals["tokens"] == sum(r["tokens"] for r in rows)


def test_same_inputs_same_bytes_and_existing_out_refused(tree, written):
    out, _ = written
    again = tree / "again"
    assert run(again, "--roots", tree / "lib", tree / "site", "--min-chars", 1000, "--heldout-fraction", 0.3,
               "--tokenizer", tree / "tokenizer.json").returncode == 0
    for name in ("train.jsonl", "short.jsonl", "heldout.jsonl"):
        assert (again / name).read_bytes() == (out / name).read_bytes()
    first, second = (json.loads((d / "manifest.json").read_text()) for d in (out, again))
    assert first == second
    done = run(again, "--roots", tree / "lib")
    assert done.returncode == 2
    assert done.stderr.strip() == (f"error: {again}: already exists; pass --overwrite to replace it, "
                                   "or choose another OUT_DIR")
    assert run(again, "--roots", tree / "lib", "--min-chars", 1000, "--overwrite").returncode == 0
    assert json.loads((again / "manifest.json").read_text())["totals"]["train"]["tokens"] is None  # no tokenizer


def test_short_documents_are_single_train_files_within_the_bounds(tree, written):
    out, _ = written
    train, short = _rows(out / "train.jsonl"), _rows(out / "short.jsonl")
    lo, hi = json.loads((out / "manifest.json").read_text())["short_chars"]
    sections = {(r["package"], sec) for r in train if r["kind"] == "code"
                for sec in ("# file: " + part for part in r["text"].split("# file: ")[1:])}
    assert short and all(r["kind"] == "file" and r["files"] == 1 and lo <= len(r["text"]) <= hi for r in short)
    assert {(r["package"], r["text"]) for r in short} <= sections  # from train packages only
    expected = {(p, sec) for p, sec in sections if lo <= len(sec) <= hi}
    assert {(r["package"], r["text"]) for r in short} == expected


@pytest.mark.parametrize("args, message", [
    (["--heldout-fraction", "1.5"], "error: --heldout-fraction 1.5: must be in [0, 1)"),
    (["--min-chars", "0"], "error: --min-chars 0: must be a positive number of characters"),
    (["--short-chars", "500", "100"], "error: --short-chars 500 100: must be 0 < MIN <= MAX"),
    (["--tokenizer", "/nonexistent"], "error: --tokenizer /nonexistent: no tokenizer.json there; pass a tokenizer "
                                      "directory or tokenizer.json"),
])
def test_bad_arguments_are_one_line(tree, args, message):
    done = run(tree / "bad", "--roots", tree / "lib", *args)
    assert done.returncode == 2
    assert done.stderr.strip() == message
    assert not (tree / "bad").exists()
