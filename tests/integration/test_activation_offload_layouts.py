"""parallel.offload_activations (host, disk) gives the bits of no offload under every CP impl
(cp 4: ring, all-gather, Ulysses, hybrid 2 x 2), both model paths and ZeRO 0-3 (cp 2 x dp 2,
DeepSpeed's engine as the trainer builds it), in one spawned gloo group of 4 (helpers/offload_layouts.py)."""
from helpers.cp import run_distributed
from helpers.offload_layouts import offload_checks

WORLD = 4
L = 24  # divisible by 2 x cp for the zigzag shards


def test_offload_is_exact_under_every_layout():
    results = run_distributed(offload_checks, WORLD, L, timeout=600)
    bad = [f"rank {r}: {case} {what}: {diff:g} > {tol:g}"
           for r, checks in enumerate(results) for case, what, diff, tol in checks if not diff <= tol]
    assert not bad, "\n".join(bad)
    cases = {case for case, *_ in results[0]}
    assert len(cases) == 18, sorted(cases)  # 12 cp cases, 5 ZeRO cases, the folder
