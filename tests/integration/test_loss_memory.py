"""Chunked cross-entropy holds far less memory than the plain one: the peak RSS growth of a
loss forward+backward, measured in a process of its own by the benchmark (benchmarks/bench_loss.py,
on pythonpath)."""
from bench_loss import measure


def test_chunked_loss_peak_memory_is_a_fraction_of_plain():
    """Subprocess RSS growth of loss forward+backward (4k tokens x 32k vocab, fp32)."""
    plain = measure("plain", 4096, 32000, 256)
    chunked = measure("chunked", 4096, 32000, 256, chunk=512)
    assert abs(plain["loss"] - chunked["loss"]) <= 1e-5 * plain["loss"]
    assert chunked["peak_growth_gb"] <= 0.25 * plain["peak_growth_gb"], (chunked, plain)


def test_chunked_loss_holds_one_chunk_of_logits_at_a_time():
    """bf16, 4096 tokens x 32k vocab in chunks of 2048: the peak is one chunk's fp32 logits
    (250 MiB) plus the head-sized gradients and row-block temporaries, not both chunks. A narrow
    hidden size keeps the bf16 matmuls short on CPUs without bf16 instructions (AVX2)."""
    tokens, vocab, hidden, chunk = 4096, 32000, 64, 2048
    chunked = measure("chunked", tokens, vocab, hidden, "bfloat16", chunk=chunk)
    chunk_logits_gb = chunk * vocab * 4 / 2**30
    head_fp32_gb = vocab * hidden * 4 / 2**30
    assert chunked["peak_growth_gb"] <= 1.3 * chunk_logits_gb + 3 * head_fp32_gb, chunked
