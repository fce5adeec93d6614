"""The `longctx demo` pipeline: plan (what runs), stages (training jobs), evaluation, report."""
