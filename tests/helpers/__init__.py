"""Helpers shared by tests/unit and tests/integration (importable as `helpers.*`: pytest puts tests/ on sys.path)."""
