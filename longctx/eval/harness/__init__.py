"""longctx in lm-evaluation-harness (needs the `eval` extra: pip install 'longctx[eval]'):
model.py, the lm-eval model (LongctxLM) over a longctx model; loglik.py, its scoring through the
chunked loss; options.py, --lm-eval's options and tasks (checked before torch loads); run.py, the
`longctx eval --lm-eval` run and its outputs."""
