#!/usr/bin/env bash
# The two quick-start commands:   ./run.sh demo   |   ./run.sh test
# Each creates (once) a project-local virtualenv in .venv and installs longctx into it.
# On a machine without CUDA, a CPU build of torch is installed first so that pip never
# pulls a multi-GB CUDA wheel. `test` lints with ruff (pyproject.toml [tool.ruff]), installs the
# oldest transformers the test extra allows beside the venv's own (once), then runs pytest.
# Extra arguments are passed through (to `longctx demo` / pytest); `test --all` adds the heavy tests
# (tests/README.md: the tiers, the workers and the suite's time budget).
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/bootstrap.sh
cmd="${1:-demo}"; shift || true
case "$cmd" in
  demo) exec .venv/bin/longctx demo "$@" ;;
  test) if [ "${1:-}" = "--all" ]; then shift; set -- -m "" "$@"; fi  # the heavy tests too
        .venv/bin/ruff check --quiet .
        # the oldest transformers pyproject.toml allows, for tests/integration/test_export_compat.py (once per venv)
        .venv/bin/python tests/helpers/transformers_overlay.py >/dev/null
        # every test's wall time, processes and waits (tests/helpers/suite_profile.py); the run ends
        # with its wall time and its ten slowest tests (tests/README.md: the budget)
        profile=".pytest_cache/suite_profile.jsonl"
        mkdir -p .pytest_cache && rm -f "$profile"
        start=$(date +%s) rc=0
        LONGCTX_SUITE_PROFILE="$profile" .venv/bin/python -m pytest -p helpers.suite_profile "$@" || rc=$?
        .venv/bin/python scripts/tools/suite_table.py "$profile" --slowest 10 --wall-s $(( $(date +%s) - start )) || true
        exit "$rc" ;;
  *) echo "usage: ./run.sh demo|test [args...]" >&2; exit 2 ;;
esac
