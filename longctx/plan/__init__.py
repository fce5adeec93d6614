"""Memory planner: per-device peak memory of one training stage, and the smallest layout that fits.

The estimate follows what this trainer actually allocates (longctx/train/loop.py, the model in
longctx/model/llama.py, DeepSpeed's ZeRO optimizers), phase by phase, and reports the
breakdown at the phase with the highest total:

    init       model built, then flattened/partitioned by DeepSpeed (two copies briefly)
    loss       end of the forward: every saved activation + the chunked loss's workspace
    backward   saved activations + gradient buffers + one block's backward (and its
               recomputation under activation checkpointing) + attention/communication buffers
    step       gradients + optimizer states + the optimizer's temporaries

Notation (per device): P parameters, W = world size (ZeRO shards over all dp x cp ranks),
t = micro_batch_size * seq_len / cp local tokens, d hidden, f intermediate, L layers, Hq/Hkv
heads of size D, V vocabulary, c = train.loss_chunk_size, b bytes of the compute dtype.

Model states (bytes per parameter, the ZeRO paper's accounting, as DeepSpeed 0.1x does it):
    fp32         z0: 4 params + 4 grads + 8 Adam            z1: 4 + 4 + (4 master copy + 8)/W
                 z2: 4 + 4/W + 12/W                         z3: 4/W + 4/W + 12/W
    bf16         z0: 2 + 2 + 4 fp32 grads + 12 (master+Adam), all replicated
                 z1: 2 + 2 + 4 fp32 grad accumulator + 12/W  (DeepSpeed's BF16_Optimizer)
                 z2: 2 + 2/W + 12/W                          z3: 2/W + 2/W + 12/W
  plus DeepSpeed's gradient reduction buckets (reduce_bucket_size = 5e8 elements, two with
  overlap_comm at z2) and the ZeRO-3 gathered-parameter working set. With optimizer offload the
  master weights, Adam states and fp32 gradient partitions live in host memory (reported
  separately); parameter offload (z3) moves the parameter partitions there too.

Activations per token and layer saved for backward (no checkpointing), in elements of b bytes:
    6d (block input, normed input, projection input; twice) + 3 HqD + 2 HkvD (rotated q,
    k, v, attention output and its reshaped copy) + 4f (gate, silu, up, product)
  `full` checkpointing keeps only the block input (d) of every layer; `selective` (every k-th
  block) does so for ceil(L/k) blocks. Backward adds one block's activations (recomputed) and
  its gradient temporaries (3f + 3d).

On a GPU the caching allocator reserves whole buffers and the CUDA context/NCCL need memory of
their own; on CPU the measured peak is RSS, which only counts pages a process has touched, so a
5e8-element bucket costs only the part gradients fill. `device` selects these semantics.
"""
from longctx.plan.layout import (
    BUCKET,
    MAX_LIVE,
    PREFETCH,
    Layout,
    layout_of,
    parameter_counts,
    planned_deepspeed,
    relative_time_per_token,
)
from longctx.plan.memory import (
                                 COMPONENTS,
                                 GPU_USABLE,
                                 RUNTIME_GB,
                                 GiB,
                                 MemoryEstimate,
                                 estimate_layout,
                                 estimate_memory,
)
from longctx.plan.report import fmt_bytes, format_estimate, parse_length, parse_size

__all__ = ["BUCKET", "COMPONENTS", "GPU_USABLE", "GiB", "Layout", "MAX_LIVE", "MemoryEstimate", "PREFETCH",
           "RUNTIME_GB",
           "estimate_layout", "estimate_memory", "fmt_bytes", "format_estimate", "layout_of", "parameter_counts",
           "parse_length", "parse_size", "planned_deepspeed", "relative_time_per_token"]
