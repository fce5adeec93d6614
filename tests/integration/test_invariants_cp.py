"""The layouts invariant (tests/unit/test_invariants.py has causality and padding): ring,
all-gather, Ulysses and hybrid give one process's loss and gradients, for the transformers
path's 11 types and the native families, on row layouts hypothesis generates (trailing padding
on some shards and not others, packed documents with and without document masks, documents
crossing the shard boundaries, a row of one real token). The cases are drawn here and checked
in one spawned gloo world per cp size. The cp 2 world also counts the ring's sends in the backward
of checkpointed GPT-OSS layers: selective checkpointing keeps longctx::cp_attention_sinks."""
from hypothesis import given, settings

from helpers.cp import check_all, run_distributed
from helpers.invariants_cp import cp2_checks, layout_checks
from helpers.layouts import Layout, layouts

# hybrid is a real hybrid (2 rings x 2 Ulysses ranks) at cp 4 only; cp 4 adds the ring with padding
# over three of its four ranks (Ulysses at cp 4, uneven heads included, is test_cp_model.py's)
IMPLS = {2: {"ring": ("ring", None), "allgather": ("allgather", None), "ulysses": ("ulysses", None)},
         4: {"ring": ("ring", None), "hybrid2x2": ("hybrid", 2)}}
TYPES = 15  # 11 transformers-path types and 4 native families


def _draw(cp: int, n: int, max_len: int, n_always: int = 3) -> list:
    """`n` layouts of lengths divisible by 2 * cp, drawn by hypothesis (derandomized), after the
    first `n_always` hostile ones: one real token then padding over every other shard, two
    documents without masks whose boundary is off the shard edges, a document crossing a shard
    edge with padding after it."""
    drawn = []

    @settings(max_examples=n, deadline=None, derandomize=True, database=None)
    @given(layout=layouts(min_len=2 * cp, max_len=max_len, multiple=2 * cp))
    def collect(layout):
        drawn.append(layout)

    collect()
    L = 4 * cp
    always = [Layout((1,), L - 1, True), Layout((L // 2 + 1, L // 2 - 2), 1, False),
              Layout((cp + 1, L - cp - 3), 2, True)]
    return list(dict.fromkeys(always[:n_always] + drawn))[:n + n_always]


def test_every_cp_impl_equals_one_process_on_generated_layouts_cp2():
    cases = _draw(2, 4, 16)
    check_all(run_distributed(cp2_checks, 2, cases, IMPLS[2], timeout=600),
              min_checks=2 * TYPES * len(IMPLS[2]) * len(cases) + 3)


def test_every_cp_impl_equals_one_process_on_generated_layouts_cp4():
    cases = _draw(4, 1, 16, n_always=1)
    check_all(run_distributed(layout_checks, 4, cases, IMPLS[4], timeout=600),
              min_checks=2 * TYPES * len(IMPLS[4]) * len(cases))
