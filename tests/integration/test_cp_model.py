"""The whole model under context parallelism gives the loss and parameter gradients of cp = 1,
for each family (Llama, Qwen2's q/k/v biases, Qwen3's q/k norms and wide head_dim, Mistral with
a window no shorter than the sequence), and two training steps of every transformers-path model
type (windows, softcaps, sinks, MoE load-balancing loss) give one process's losses and weights."""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers.auto_cp import auto_checks
from helpers.auto_models import TYPES as AUTO_TYPES
from helpers.cp import run_distributed
from helpers.model import perturb_norms_and_biases
from longctx.eval.teacher_forced import ForcedRow
from longctx.model import build_model, get_preset
from longctx.parallel import make_cp_attention, positions_from_segments, shard_batch
from longctx.parallel.checkpointing import apply_activation_checkpointing, model_key
from longctx.train.probe import ProbeItem, probe_tallies
from longctx.train.validation import heldout_sums, rank_batches, validation_record

REL_TOL = 1e-5
FAMILIES = {"llama": "debug-tiny", "qwen2": "debug-tiny-qwen2", "qwen3": "debug-tiny-qwen3",
            "mistral": "debug-tiny-mistral"}


def _build(preset):
    cfg = get_preset(preset)
    if cfg.model_type == "mistral":
        cfg = cfg.replace(sliding_window=64)  # at least the sequence: full attention, as transformers runs it
    return perturb_norms_and_biases(build_model(cfg, seed=3), seed=4)


def _batch(L, docs):
    g = torch.Generator().manual_seed(5)
    B, V = 2, get_preset("debug-tiny").vocab_size
    ids = torch.randint(0, V, (B, L), generator=g)
    labels = torch.cat([ids[:, 1:], torch.full((B, 1), -100)], dim=1)  # pre-shifted targets
    batch = {"input_ids": ids, "labels": labels}
    if docs:
        seg = torch.zeros(B, L, dtype=torch.long)
        for b, cuts in enumerate(([5, 13, 20], [9, 16])):
            for c in cuts:
                seg[b, c:] += 1
        # no target across a document boundary
        batch["labels"] = labels.masked_fill(
            torch.cat([seg[:, 1:] != seg[:, :-1], torch.ones(B, 1, dtype=torch.bool)], 1), -100)
        batch["segment_ids"] = seg
        batch["position_ids"] = positions_from_segments(seg)
    return batch


def _loss_sum(model, batch):
    logits = model(batch["input_ids"], position_ids=batch.get("position_ids"), segment_ids=batch.get("segment_ids"))
    return F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=-100, reduction="sum")


def _heldout_rows(L):
    """Three rows (two of packed documents, one whole): an odd count, so dp = 2 runs a blank row."""
    docs, whole = _batch(L, True), _batch(L, False)
    whole["segment_ids"] = torch.zeros_like(whole["input_ids"])
    whole["position_ids"] = torch.arange(L).expand(2, L)
    keys = ("input_ids", "labels", "position_ids", "segment_ids")
    return [{k: b[k][i:i + 1] for k in keys} for b, i in ((docs, 0), (docs, 1), (whole, 0))]


def _probe_items(L):
    """Three probe rows of random tokens (lengths L - 5, L / 2 + 3, L) whose answers are the one-process
    model's argmax (reference 0: right) but for one token (reference 1: wrong): an odd count, so
    dp = 2 runs a blank row."""
    g = torch.Generator().manual_seed(7)
    model = build_model(get_preset("debug-tiny"), seed=3)
    items = []
    for n in (L - 5, L // 2 + 3, L):
        ids = torch.randint(0, get_preset("debug-tiny").vocab_size, (1, n), generator=g)
        argmax = model(ids).argmax(-1)[0].tolist()  # (n,)
        at = list(range(n - 6, n - 1))  # the answer: 5 positions before the row's end
        labels, refs = [-100] * n, [-1] * n
        for k, j in enumerate(at):
            labels[j] = argmax[j] if k != 3 else (argmax[j] + 1) % 64
            refs[j] = 0 if k < 2 else 1
        items.append(ProbeItem("t", L, ForcedRow(ids[0].tolist(), labels, refs, 2), L))
    return items


def _probe_checks(rank, world, layouts):
    """The probe's (misses, tokens) per reference (train/probe.py) under each layout equal one process's."""
    cfg, L = get_preset("debug-tiny"), 24
    items = _probe_items(L)
    common = dict(device=torch.device("cpu"), pad_id=0)
    ref = probe_tallies(build_model(cfg, seed=3), items, dp_rank=0, dp_size=1, cp_rank=0, cp_size=1, **common)
    assert ref[:, 0, 0].sum() == 0 and ref[:, 1, 0].sum() == 3  # the rows are built so: not a test of zeros
    checks = []
    for name, (impl, u) in layouts.items():
        model = build_model(cfg, seed=3)
        if impl is None:
            got = probe_tallies(model, items, dp_rank=rank, dp_size=world, cp_rank=0, cp_size=1, **common)
        else:
            model.set_attention(make_cp_attention(None, impl=impl, ulysses_size=u))
            got = probe_tallies(model, items, dp_rank=0, dp_size=1, cp_rank=rank, cp_size=world, **common)
        dist.all_reduce(got)
        checks.append((f"probe/{name}", "misses, tokens", float(not torch.equal(got, ref)), 0.0))
    return checks


def _validation_checks(rank, world, impls, L):
    """Validation (train/validation.py) under cp = world for each impl, and under dp = world,
    gives one process's val_loss and loss by position (fp32)."""
    cfg = get_preset("debug-tiny")
    rows, ends = _heldout_rows(L), torch.tensor([4, 8, 16, L])
    common = dict(device=torch.device("cpu"), loss_chunk_size=7)

    def record(model, batches, cp_rank, cp_size, reduce=True):
        local = heldout_sums(model, batches, ends, cp_rank=cp_rank, cp_size=cp_size, **common)
        if reduce:
            dist.all_reduce(local)
        return validation_record(local.flatten().tolist(), tuple(ends.tolist()))

    ref = record(build_model(cfg, seed=3), rank_batches(rows, 0, 1, 2), 0, 1, reduce=False)  # one process
    layouts = {f"cp{world}-{name}": (impl, u) for name, (impl, u) in impls.items()}
    layouts[f"dp{world}"] = (None, None)
    checks = []
    for name, (impl, u) in layouts.items():
        model = build_model(cfg, seed=3)
        if impl is None:
            got = record(model, rank_batches(rows, rank, world, 2), 0, 1)
        else:
            model.set_attention(make_cp_attention(None, impl=impl, ulysses_size=u))
            got = record(model, rank_batches(rows, 0, 1, 2), rank, world)
        checks.append((f"validation/{name}", "val_loss", abs(got["val_loss"] - ref["val_loss"]) / ref["val_loss"],
                       REL_TOL))
        for label, want in ref["val_loss_by_position"].items():
            checks.append((f"validation/{name}", label, abs(got["val_loss_by_position"][label] - want) / want,
                           REL_TOL))
        checks.append((f"validation/{name}", "tokens", float(got["val_tokens"] != ref["val_tokens"]), 0.0))
    return checks + _probe_checks(rank, world, layouts)


def _model_worker(rank, world, impls, L, ckpt_impls=(), families=("llama",), ckpt_families=("llama",),
                  val_impls=None, auto_types=()):
    checks = _validation_checks(rank, world, val_impls or impls, L)
    checks += auto_checks(rank, world, impls, L, auto_types)
    for family in families:
        checks += _family_checks(rank, world, FAMILIES[family], impls, L,
                                 ckpt_impls if family in ckpt_families else ())
    if ckpt_impls:
        checks += _sac_keeps_cp_op(rank, world, get_preset("debug-tiny"), L)
    return checks


def _family_checks(rank, world, preset, impls, L, ckpt_impls):
    checks = []
    for docs in (False, True):
        batch = _batch(L, docs)
        n_tokens = int((batch["labels"] != -100).sum())  # global count of real targets
        ref = _build(preset)
        ref_loss = _loss_sum(ref, batch) / n_tokens
        ref_loss.backward()
        ref_grads = {n: p.grad for n, p in ref.named_parameters()}
        local = shard_batch(batch, rank, world)
        variants = [(name, impl, u, None) for name, (impl, u) in impls.items()]
        variants += [(f"{impl}+ckpt-{pol}", impl, None, pol) for impl in ckpt_impls
                     for pol in ("sac", "full", "sac+tiled-mlp")]
        for name, impl, u, ckpt in variants:
            model = _build(preset)
            if ckpt is not None:  # the recompute re-runs the CP forward, communication included
                apply_activation_checkpointing(model, "full", recompute_attention=(ckpt == "full"))
                model.set_mlp_tiling(5 if ckpt.endswith("tiled-mlp") else 0)  # tiles that cross documents
            model.set_attention(make_cp_attention(None, impl=impl, ulysses_size=u))
            loss_sum = _loss_sum(model, local)
            (loss_sum / n_tokens).backward()
            total = loss_sum.detach().clone()
            dist.all_reduce(total)
            case = f"{preset}/{name}/{'docs' if docs else 'nodocs'}"
            checks.append((case, "loss", abs(total.item() / n_tokens - ref_loss.item()) / abs(ref_loss.item()),
                           REL_TOL))
            for n, p in model.named_parameters():
                n = model_key(n)
                g = p.grad.clone()
                dist.all_reduce(g)  # CP ranks hold partial gradients of the same replica
                rel = (g - ref_grads[n]).abs().max().item() / max(ref_grads[n].abs().max().item(), 1e-30)
                checks.append((case, f"grad {n}", rel, REL_TOL))
    return checks


def _sac_keeps_cp_op(rank, world, cfg, L):
    """Selective checkpointing that saves the single CP op's (out, lse) gives the same gradients
    and replays none of the forward ring communication in the backward recompute."""
    import functools

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    from longctx.parallel.comm import COMM_STATS, reset_comm_stats

    batch = _batch(L, True)
    n_tokens = int((batch["labels"] != -100).sum())
    local = shard_batch(batch, rank, world)
    cp_op = torch.ops.longctx.cp_attention.default
    results, checks = {}, []
    for keep in (False, True):
        def policy(ctx, op, *args, **kwargs):
            return CheckpointPolicy.MUST_SAVE if (keep and op == cp_op) else CheckpointPolicy.PREFER_RECOMPUTE
        model = build_model(cfg, seed=3)
        for i, block in enumerate(model.layers):
            model.layers[i] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT,
                                                 context_fn=functools.partial(create_selective_checkpoint_contexts,
                                                                              policy))
        model.set_attention(make_cp_attention(None, impl="ring"))
        reset_comm_stats()
        loss = _loss_sum(model, local) / n_tokens
        fwd_bytes = COMM_STATS["p2p_bytes"]
        reset_comm_stats()
        loss.backward()
        results[keep] = (fwd_bytes, COMM_STATS["p2p_bytes"], [p.grad for p in model.parameters()])
    (f0, b0, g0), (f1, b1, g1) = results[False], results[True]
    checks.append(("sac-cp-op", "forward sends", float(f0 != f1 or f0 == 0), 0.0))
    checks.append(("sac-cp-op", "recompute replays forward comm", float(b0 != b1 + f0), 0.0))
    for a, b in zip(g0, g1):
        checks.append(("sac-cp-op", "grad", (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30), REL_TOL))
    return checks


def _check(results, variants_by_family, auto_impls=0):
    from helpers.cp import check_all
    n_params = {f: len(list(build_model(get_preset(FAMILIES[f]), device="meta").parameters())) for f in FAMILIES}
    # transformers-path models: per impl two losses and at least one weight per type
    check_all(results, min_checks=sum(2 * n * (1 + n_params[f]) for f, n in variants_by_family.items())
              + 3 * auto_impls * len(AUTO_TYPES))


def test_model_cp2_matches_cp1():
    """Every family; with activation checkpointing (selective: attention kernels kept; full
    recompute; selective with the MLPs in sequence tiles) for Llama and Qwen3."""
    impls = {"ring": ("ring", None), "allgather": ("allgather", None), "ulysses": ("ulysses", None)}
    ckpt_impls = ("ring", "ulysses")
    ckpt_families = ("llama", "qwen3")
    val_impls = dict(impls, hybrid=("hybrid", 1))  # validation also under hybrid (1 x 2) at cp = 2
    results = run_distributed(_model_worker, 2, impls, 24, ckpt_impls, tuple(FAMILIES), ckpt_families, val_impls,
                              AUTO_TYPES)
    _check(results, {f: len(impls) + (3 * len(ckpt_impls) if f in ckpt_families else 0) for f in FAMILIES},
           len(impls))


def test_model_cp4_matches_cp1():
    """Also every transformers-path model type (helpers/auto_cp.py): two SGD steps' losses and weights."""
    impls = {"ring": ("ring", None), "allgather": ("allgather", None), "ulysses": ("ulysses", None),
             "hybrid2x2": ("hybrid", 2)}
    _check(run_distributed(_model_worker, 4, impls, 24, (), tuple(FAMILIES), ("llama",), None, AUTO_TYPES,
                           timeout=600), {f: len(impls) for f in FAMILIES}, len(impls))
