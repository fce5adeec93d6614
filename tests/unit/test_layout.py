"""The house's shape (docs/architecture.md, Layout): longctx/ keeps only its entry modules at the
top, every other module in the folder of its job, and no module imports itself back through
others, neither in code nor in an annotation (the import-cycle check in scripts/)."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _import_cycles():
    found = sorted((ROOT / "scripts").rglob("import_cycles.py"))
    assert len(found) == 1, f"expected one import_cycles.py under scripts/, found {found}"
    spec = importlib.util.spec_from_file_location("import_cycles", found[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_only_the_entry_modules_sit_at_the_top_of_longctx():
    assert sorted(p.name for p in (ROOT / "longctx").glob("*.py")) == ["__init__.py", "__main__.py"]


def test_no_import_cycle_even_through_annotations():
    cycles = _import_cycles()
    edges, _ = cycles.graph(ROOT)
    assert cycles.components(edges) == []
    cycles._is_type_checking = lambda node: False  # `if TYPE_CHECKING:` imports count too
    edges, _ = cycles.graph(ROOT)
    assert cycles.components(edges) == []
