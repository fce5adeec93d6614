"""HostMemoryGuard (longctx/runtime/host_memory.py), which the trainer calls after each step:
once the resident set has crept past its reference, the free heap pages pinned between blocks
that live on go back to the system; it trims only then, and a working set larger than the
reference raises the reference instead of trimming every step."""


class _Sets:
    """A resident set that reads as each value in turn, and the trims asked for."""

    def __init__(self, values):
        self.values, self.trimmed = list(values), []

    def rss(self):
        return self.values.pop(0)

    def malloc_trim(self, pad):
        self.trimmed.append(pad)


def _guard(monkeypatch, values, **kwargs):
    from longctx.runtime import host_memory

    sets = _Sets(values)
    monkeypatch.setattr(host_memory, "_glibc", lambda: sets)
    monkeypatch.setattr(host_memory, "rss_bytes", sets.rss)
    return host_memory.HostMemoryGuard(**kwargs), sets


def test_the_reference_is_the_warm_up_s_largest_set_and_only_creep_trims(monkeypatch):
    mib = 2**20
    values = [90, 100, 95, 103, 104, 99, 105, 100, 101, 103, 104, 100, 106]  # MiB after each step
    guard, sets = _guard(monkeypatch, [v * mib for v in values], warmup=3, min_gap=4)
    for _ in values:
        guard.after_step()
    assert guard.reference == 100 * mib  # the warm-up's largest, kept: trims 4 or more steps apart
    assert guard.trims == 2 and len(sets.trimmed) == 2  # at 105 (step 7) and 106 (step 13)


def test_trims_close_together_raise_the_reference_to_the_working_set(monkeypatch):
    mib = 2**20
    values = [100, 110, 100, 111, 112]  # steps whose own working set is 110+ MiB
    guard, sets = _guard(monkeypatch, [v * mib for v in values], warmup=1, min_gap=4)
    for _ in values:
        guard.after_step()
    assert guard.reference == 111 * mib and guard.trims == 2  # then 112 is within 4% of it: no trim


def test_the_guard_does_nothing_without_glibc(monkeypatch):
    from longctx.runtime import host_memory

    monkeypatch.setattr(host_memory, "_glibc", lambda: None)
    guard = host_memory.HostMemoryGuard()
    guard.after_step()
    guard.after_step()
    assert guard.reference == 0 and guard.trims == 0
