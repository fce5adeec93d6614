"""What every benchmark in benchmarks/ shares, one job per module:

    procs      a free port, world-N gloo ranks spawned on this machine, a contender in its own process
    memory     resident set size, its peak, and the allocator setting that makes RSS track live memory
    timing     interleaved timing of named contenders: warm-up, then timed round-robin steps
    report     the timing fields every JSON row carries, markdown tables, JSON files
    model      the model a benchmark trains (preset or Hugging Face directory) and its CLI options
    peer_contenders, peer_checks   the training-step contenders of bench_peers.py and their checks
    peer_report     bench_peers.py's report: ranks' rows merged, saved reports merged, its tables

The scripts import it as `benchlib` (a script's own directory is on sys.path); the tests through
pytest's `pythonpath` (pyproject.toml)."""
