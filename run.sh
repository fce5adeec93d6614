#!/usr/bin/env bash
# The two quick-start commands:   ./run.sh demo   |   ./run.sh test
# Each creates (once) a project-local virtualenv in .venv and installs longctx into it.
# On a machine without CUDA, a CPU build of torch is installed first so that pip never
# pulls a multi-GB CUDA wheel. `test` lints with ruff (pyproject.toml [tool.ruff]), installs the
# oldest transformers the test extra allows beside the venv's own (once), then runs pytest.
# Extra arguments are passed through (to `longctx demo` / pytest).
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/bootstrap.sh
cmd="${1:-demo}"; shift || true
case "$cmd" in
  demo) exec .venv/bin/longctx demo "$@" ;;
  test) .venv/bin/ruff check --quiet .
        # the oldest transformers pyproject.toml allows, for tests/integration/test_export_compat.py (once per venv)
        .venv/bin/python tests/helpers/transformers_overlay.py >/dev/null
        exec .venv/bin/python -m pytest "$@" ;;
  *) echo "usage: ./run.sh demo|test [args...]" >&2; exit 2 ;;
esac
