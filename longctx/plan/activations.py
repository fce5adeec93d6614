"""Activation, attention-workspace, context-parallel and loss buffers of one training stage."""
from __future__ import annotations

from longctx.plan.layout import Layout, head_shards, uneven_factors

DOCUMENT_GROUP_TOKENS = 512  # longctx.attention.sdpa's (planning imports no torch; a test keeps them equal)


def activation_bytes(m, lay: Layout, device: str, document_masking: bool = True) -> dict:
    """Bytes of saved activations and the transient workspaces of one stage."""
    b = 2 if lay.dtype == "bfloat16" else 4  # bytes of the compute dtype
    t = lay.micro_batch_size * lay.seq_len // lay.cp_size  # local tokens
    return {**_saved(m, lay, device, document_masking, b, t), **_attention(m, lay, device, document_masking, b, t),
            **_cp_buffers(m, lay, b, t), **_loss(m, lay, b, t), "tokens": t}


def _saved(m, lay: Layout, device: str, document_masking: bool, b: int, t: int) -> dict:
    """What the forward keeps for the backward, under the checkpointing policy."""
    cp = lay.cp_size
    # a mixture of experts: the width of the experts each token is routed to (AutoModelSpec)
    d, f, L = m.hidden_size, getattr(m, "active_intermediate_size", m.intermediate_size), m.num_hidden_layers
    q, kv = m.num_attention_heads * m.head_dim, m.num_key_value_heads * m.head_dim
    Hq = m.num_attention_heads
    # MLP activations: gate, its silu, up and their product; with parallel.mlp_tile_tokens the
    # MLP keeps only its input, and its backward holds one tile (recomputed and its gradients)
    tile = min(lay.mlp_tile_tokens, t) if lay.mlp_tile_tokens else 0
    mlp_acts = 0 if tile else 4 * f
    # saved per layer (elements per token): each RMSNorm keeps its input and an fp32 1/rms (4 bytes)
    per_layer = t * (b * (4 * d + 3 * q + 2 * kv + mlp_acts) + 4 * Hq + 2 * 4)
    if getattr(m, "qk_norm", False):  # q and k before their norms, and an fp32 1/rms per head
        per_layer += t * (b * (q + kv) + 4 * (Hq + m.num_key_value_heads))
    block_input = t * b * d
    rope = 2 * t * m.head_dim * 4  # cos, sin (fp32), shared by all layers
    final = t * (2 * b * d + 4)  # last block output and 1/rms, the final norm's output (the loss input)
    is_wrapped = [lay.activation_checkpointing == "full" or
                  (lay.activation_checkpointing == "selective" and i % lay.checkpoint_every == 0) for i in range(L)]
    # a checkpointed block keeps its input and, unless parallel.recompute_attention, the
    # attention kernel's output and LSE (selective activation checkpointing keeps the fused
    # kernel's results so the recomputation never reruns attention or its cp communication).
    # CPU kernels tile multi-document calls: about two kernel calls (outputs) per query row
    # (sdpa on a GPU without cp: document calls whose outputs are concatenated, one output kept).
    calls = 2 if (document_masking and cp == 1
                  and (device == "cpu" or lay.attention_backend == "eager")) else 1
    attn_kept = 0 if lay.recompute_attention else calls * t * (q * b + 4 * Hq)
    # parallel.offload_activations: the block inputs leave the device; two are on it at a time
    # (one being copied out or back, the next block's prefetch)
    offloaded = lay.offload_activations != "none"
    kept = [(0 if offloaded else block_input) + attn_kept if w else per_layer for w in is_wrapped]
    in_flight = 2 * block_input if offloaded and any(is_wrapped) else 0
    saved = sum(kept) + rope + final + in_flight  # at the end of the forward
    # while the last block runs (forward, recomputation, backward), the blocks below keep what
    # they saved and the last block has all of its activations (saved or recomputed)
    top = sum(kept[:-1]) + rope + per_layer + in_flight
    recompute = per_layer if is_wrapped[-1] else 0
    mlp_saved = t * b * (mlp_acts + 2 * d)  # a block's MLP half: freed before its attention backward runs
    # gradient temporaries of the MLP backward (and the residual); a tile's recomputed activations
    mlp_bwd = t * b * 2 * d + (tile * b * 7 * f if tile else t * b * 3 * f)
    return {"saved": saved, "top": top, "recompute": recompute, "mlp_saved": mlp_saved, "mlp_bwd": mlp_bwd,
            "offloaded": block_input * sum(is_wrapped) if offloaded else 0}


def _attention(m, lay: Layout, device: str, document_masking: bool, b: int, t: int) -> dict:
    """The attention kernel's workspace (per layer, transient), with the document mask's."""
    cp = lay.cp_size
    q, kv = m.num_attention_heads * m.head_dim, m.num_key_value_heads * m.head_dim
    Hq = m.num_attention_heads
    shards = head_shards(m, lay)
    fq, fkv = uneven_factors(m, lay)
    if fq != 1.0:  # uneven Ulysses shards: the busiest member's head-sharded q and its kv heads
        q, kv = int(q * fq), int(kv * fkv)
    if cp == 1:
        attn_fwd = t * q * b
        attn_bwd = t * (q + 2 * kv) * b + (t * q * 4 if device == "gpu" else 0)  # dq/dk/dv (+ flash dq accumulator)
        if device == "gpu" and kv != q:
            attn_bwd += 2 * t * q * b  # flash-attn expands dK/dV to the query heads for GQA
    else:
        attn_fwd = 2 * t * q * 4 + t * q * b  # fp32 output accumulator + merge temporaries, block output
        attn_bwd = t * q * 4 + t * (q + 2 * kv) * b  # fp32 dq accumulator + block gradients
    if device == "cpu" and lay.attention_backend != "eager":
        # the CPU flash backward, when its (row, kv head) items do not divide among the threads,
        # runs stacked query pieces (attention/balanced.py): dout, q, out and repeated k, v
        attn_bwd += t * (3 * q + 2 * kv) * b
    # Document masks: flash-attn (GPU default) runs packed documents as variable-length
    # sequences. The sdpa/eager kernels (CPU, or chosen on GPU with cp) tile a call that has several
    # documents into 1024 x 1024 blocks: fp32 accumulators for out/lse (forward) and dq/dk/dv
    # (backward) plus boolean masks for the tiles a document boundary crosses (about 2 rows of
    # tiles per boundary; a few documents per row assumed) and one additive mask tile.
    # sdpa on a GPU without cp runs one causal SDPA call per long document and a masked call per
    # group of short ones (no T x T mask): the calls' outputs and their concatenation, a group's
    # mask and its additive bias, and in the backward each call's gradients beside the whole
    # dq/dk/dv they are copied into
    runs = document_masking and device == "gpu" and cp == 1 and lay.attention_backend == "sdpa"
    masked = document_masking and not runs and (device == "cpu" or lay.attention_backend in ("sdpa", "eager"))
    if runs:
        attn_fwd += t * q * b
        attn_bwd += t * (q + 2 * kv) * b
    B = lay.micro_batch_size
    tile = 1024
    rows = t // B  # queries of one kernel call
    if lay.cp_impl == "allgather" and cp > 1:
        keys = lay.seq_len
    elif shards is not None:  # a Ulysses member attends the sequence of its ring shard
        rows = keys = lay.seq_len * shards.degree // cp
    else:
        keys = rows
    if masked:
        boundaries = 2
        mask = B * (boundaries * 2 * max(rows, keys) * min(tile, keys) + tile * tile * b)
        attn_fwd += B * rows * (Hq if shards is None else shards.max_heads) * m.head_dim * 4
        attn_bwd += t * (q + 2 * kv) * 4
    else:
        mask = DOCUMENT_GROUP_TOKENS**2 * (1 + b) if runs else 0  # one group's mask and bias
    if lay.attention_backend == "eager":  # materialized fp32 scores and probabilities per tile/call
        mask += 2 * B * Hq * (min(rows, tile) * min(keys, tile) if masked else rows * keys) * 4
    return {"attn_fwd": attn_fwd, "attn_bwd": attn_bwd, "mask": mask}


def _cp_buffers(m, lay: Layout, b: int, t: int) -> dict:
    """Context-parallel communication buffers (per layer, transient)."""
    cp = lay.cp_size
    q, kv = m.num_attention_heads * m.head_dim, m.num_key_value_heads * m.head_dim
    fq, fkv = uneven_factors(m, lay)
    comm_fwd = comm_bwd = 0
    if cp > 1:
        kvb = 2 * t * kv * b  # local K and V
        if lay.cp_impl == "ring":
            comm_fwd = 2 * kvb  # stacked K/V being sent + the one received
            comm_bwd = 2 * kvb + 2 * (2 * t * kv * 4)  # K/V and their fp32 dK/dV travel together
        elif lay.cp_impl == "allgather":
            comm_fwd = cp * kvb  # the whole sequence's K/V
            comm_bwd = cp * kvb + cp * 2 * t * kv * 4  # gathered again + fp32 dK/dV before reduce-scatter
        else:  # ulysses / hybrid: all-to-all of q, k, v and the output; hybrid adds a ring of K/V
            if fq != 1.0:  # uneven shards: the busiest member's heads, shared kv heads sent twice
                q, kv = int(q * fq), int(kv * fkv)
            comm_fwd = 2 * t * (2 * q + 2 * kv) * b
            comm_bwd = comm_fwd + 2 * t * (q + 2 * kv) * 4
            if lay.cp_impl == "hybrid" and cp // max(1, lay.ulysses_size) > 1:
                comm_bwd += 2 * kvb * lay.ulysses_size
    return {"comm_fwd": comm_fwd, "comm_bwd": comm_bwd}


def _loss(m, lay: Layout, b: int, t: int) -> dict:
    """The chunked cross-entropy: one chunk's fp32 logits (+ the bf16 matmul output), the fp32
    head gradient and the hidden-state gradient, all created in the forward."""
    d, V = m.hidden_size, m.vocab_size
    c = min(lay.loss_chunk_size, t)
    loss_fwd = c * V * 4 + (2 * c * V * b if b == 2 else 0) + V * d * 4 + t * d * b
    loss_bwd = V * d * 4 + t * d * b + V * d * b + t * d * b  # saved grads, scaled copies
    return {"loss_fwd": loss_fwd, "loss_bwd": loss_bwd}
