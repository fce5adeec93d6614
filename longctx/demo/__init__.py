"""The `longctx demo` pipeline: config (what runs), jobs (the training jobs), evaluation, report."""
