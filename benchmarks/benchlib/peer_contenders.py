"""The contenders of benchmarks/bench_peers.py, each one training step of the same model loaded
from the same Hugging Face checkpoint, on the same batch.

    hf          transformers LlamaForCausalLM (sdpa, gradient_checkpointing_enable()), one process
    ours        longctx Transformer (full activation checkpointing, chunked loss), one process
    alst        DeepSpeed ALST on LlamaForCausalLM: Ulysses SP attention + SP data-loader adapter,
                the loss averaged over the SP group as transformers' Trainer integration does
    alst-tiled  alst + TiledMLP + TiledFusedLogitsLoss (ALST's memory tiling)
    ring / ulysses / allgather   longctx context parallelism over all ranks

Every multi-rank contender runs under a DeepSpeed engine (ZeRO-1, same config, same fused AdamW);
the single-process ones use the AdamW alone. A contender is built once per sequence length and
then stepped many times; `forward_backward` + `optimizer_step` make one training step.
"""
from __future__ import annotations

import argparse
import math
import types
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from longctx.model.hf import load_pretrained, to_hf_key
from longctx.parallel import make_cp_attention, shard_batch
from longctx.parallel.checkpointing import apply_activation_checkpointing
from longctx.parallel.zero import build_optimizer, deepspeed_config, initialize_engine

SINGLE = ("hf", "ours")
ALST = ("alst", "alst-tiled")
CP = ("ring", "ulysses", "allgather")
ALL_IMPLS = SINGLE + ALST + CP
OPTIM = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, offload=False)


def add_contender_args(p: argparse.ArgumentParser) -> None:
    """The command-line settings of the contenders (bench_peers.py, peak_tensors.py)."""
    p.add_argument("--loss-chunk", type=int, default=2048, help="longctx chunked-loss tokens per chunk")
    p.add_argument("--alst-loss-shard-tokens", type=int, default=0,
                   help="tokens per TiledFusedLogitsLoss shard (0: ALST's default of ~1 GiB of fp32 logits)")
    p.add_argument("--recompute-attention", action="store_true",
                   help="longctx: replay the attention kernel in backward instead of keeping its tensors "
                        "(parallel.recompute_attention=true: less memory per token, one more attention forward)")
    p.add_argument("--mlp-tile-tokens", type=int, default=0,
                   help="longctx: run each MLP in sequence tiles of this many tokens "
                        "(parallel.mlp_tile_tokens: the backward holds one tile's MLP activations)")


def contender_options(args) -> dict:
    """The settings add_contender_args parsed, as build_contender's keywords (each takes its own)."""
    return {"loss_chunk": args.loss_chunk, "loss_shard_tokens": args.alst_loss_shard_tokens,
            "recompute_attention": args.recompute_attention, "mlp_tile_tokens": args.mlp_tile_tokens}


def make_batch(vocab_size: int, seq_len: int, seed: int = 0) -> dict:
    """One packed row of random tokens; labels as transformers takes them (unshifted)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (1, seq_len), generator=g)  # (1, T)
    return {"input_ids": ids, "labels": ids.clone(), "position_ids": torch.arange(seq_len)[None]}


def shifted_labels(labels: torch.Tensor) -> torch.Tensor:
    """(B, T) unshifted -> pre-shifted (labels[t] is the target of position t; last ignored)."""
    return torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)


def _ds_config(world: int, dtype: torch.dtype) -> dict:
    return deepspeed_config(zero_stage=1, micro_batch_size=1, grad_accum=1, world_size=world,
                            dtype="bfloat16" if dtype == torch.bfloat16 else "float32", grad_clip=1.0)


def _hf_model(ckpt: str, dtype: torch.dtype):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(ckpt, dtype=dtype, attn_implementation="sdpa")
    model.config.use_cache = False
    model.gradient_checkpointing_enable()
    model.train()
    return model


class Contender:
    name: str
    single = False  # runs on rank 0 alone (the other ranks wait)

    def prepare(self, batch: dict) -> dict:  # outside the timed step (the data loader's work)
        return batch

    def forward_backward(self, inputs: dict) -> float:  # returns the global mean loss
        raise NotImplementedError

    def optimizer_step(self) -> None:
        raise NotImplementedError

    def named_grads(self) -> dict:
        """Full fp32 gradients by Hugging Face parameter name (after forward_backward)."""
        raise NotImplementedError


class HFSingle(Contender):
    name, single = "hf", True

    def __init__(self, ckpt: str, dtype: torch.dtype, **_):
        self.model = _hf_model(ckpt, dtype)
        self.opt = build_optimizer(self.model, **OPTIM)

    def forward_backward(self, inputs):
        loss = self.model(input_ids=inputs["input_ids"], labels=inputs["labels"]).loss
        loss.backward()
        return float(loss.detach())

    def optimizer_step(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def named_grads(self):
        return {n: p.grad.float() for n, p in self.model.named_parameters()}


def _ours_model(ckpt: str, dtype: torch.dtype, recompute_attention: bool, mlp_tile_tokens: int):
    model = load_pretrained(ckpt, dtype=dtype)
    apply_activation_checkpointing(model, "full", recompute_attention=recompute_attention)
    model.set_mlp_tiling(mlp_tile_tokens)
    model.train()
    return model


def _ours_names(model) -> dict:
    return {to_hf_key(n.replace("_checkpoint_wrapped_module.", "")): p for n, p in model.named_parameters()}


class OursSingle(Contender):
    name, single = "ours", True

    def __init__(self, ckpt: str, dtype: torch.dtype, loss_chunk: int = 2048, recompute_attention: bool = False,
                 mlp_tile_tokens: int = 0, **_):
        self.model = _ours_model(ckpt, dtype, recompute_attention, mlp_tile_tokens)
        self.opt = build_optimizer(self.model, **OPTIM)
        self.loss_chunk = loss_chunk

    def prepare(self, batch):
        return {"input_ids": batch["input_ids"], "labels": shifted_labels(batch["labels"])}

    def forward_backward(self, inputs):
        loss_sum, n = self.model(inputs["input_ids"], labels=inputs["labels"], loss_chunk_size=self.loss_chunk)
        loss = loss_sum / n
        loss.backward()
        return float(loss.detach())

    def optimizer_step(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def named_grads(self):
        return {n: p.grad.float() for n, p in _ours_names(self.model).items()}


def _engine_grads(named_params: dict) -> dict:
    from deepspeed.utils import safe_get_full_grad

    return {n: safe_get_full_grad(p).float() for n, p in named_params.items()}


class OursCP(Contender):
    """The trainer's step (longctx/train/loop.py): zigzag shard, chunked loss, loss_sum scaled by
    world / N so DeepSpeed's world average is the single-device mean's gradient."""

    def __init__(self, name: str, ckpt: str, dtype: torch.dtype, world: int, loss_chunk: int = 2048,
                 recompute_attention: bool = False, mlp_tile_tokens: int = 0, **_):
        self.name, self.world, self.loss_chunk = name, world, loss_chunk
        self.model = _ours_model(ckpt, dtype, recompute_attention, mlp_tile_tokens)
        self.model.set_attention(make_cp_attention(None, impl=name))
        opt = build_optimizer(self.model, **OPTIM)
        self.engine, _ = initialize_engine(self.model, opt, _ds_config(world, dtype))

    def prepare(self, batch):
        local = shard_batch({"input_ids": batch["input_ids"], "labels": shifted_labels(batch["labels"]),
                             "position_ids": batch["position_ids"]}, dist.get_rank(), self.world)
        n = torch.tensor([float((local["labels"] != -100).sum())])
        dist.all_reduce(n)
        local["n_tokens"] = float(n)
        return local

    def forward_backward(self, inputs):
        loss_sum, _ = self.engine(inputs["input_ids"], position_ids=inputs["position_ids"], labels=inputs["labels"],
                                  loss_chunk_size=self.loss_chunk)
        self.engine.backward(loss_sum * (self.world / inputs["n_tokens"]))
        total = loss_sum.detach().reshape(1)
        dist.all_reduce(total)
        return float(total) / inputs["n_tokens"]

    def optimizer_step(self):
        self.engine.step()

    def named_grads(self):
        return _engine_grads(_ours_names(self.model))


# ----------------------------------------------------------------------------------- ALST
class _Repeat(torch.utils.data.Dataset):
    def __init__(self, batch: dict, n: int):
        self.batch, self.n = batch, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.batch


def _tiled_mlp_forward(mlp, x):
    """LlamaMLP.forward through DeepSpeed's TiledMLP, with ALST's shard count: ceil(seqlen /
    hidden), the same on every rank (a max over the group)."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

    shards = torch.tensor(math.ceil(x.shape[-2] / x.shape[-1]))
    dist.all_reduce(shards, op=dist.ReduceOp.MAX)
    params = [mlp.down_proj.weight, mlp.gate_proj.weight, mlp.up_proj.weight]
    return TiledMLP.apply(type(mlp).forward, mlp, x, int(shards), params)


class ALSTContender(Contender):
    """`register_with_transformers` replaces transformers' registered "sdpa" function with the
    Ulysses wrapper for the whole process; the benchmark also runs plain transformers in this
    process, so each ALST step puts the wrapper in place and takes it out again."""

    attention: dict = {}  # "ulysses" (the wrapper, registered once per process) and "plain"
    mpu = None

    @classmethod
    def register(cls, ckpt: str, world: int) -> None:
        from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        if cls.attention:
            return
        plain = ALL_ATTENTION_FUNCTIONS["sdpa"]
        cls.mpu = UlyssesSPAttentionHF.register_with_transformers(
            model_name_or_path=ckpt, core_attn_implementation="sdpa", sequence_parallel_size=world,
            micro_batch_size=1, seq_length_is_variable=True)
        cls.attention.update(ulysses=ALL_ATTENTION_FUNCTIONS["sdpa"], plain=plain)
        ALL_ATTENTION_FUNCTIONS["sdpa"] = plain

    def __init__(self, name: str, ckpt: str, dtype: torch.dtype, world: int, loss_shard_tokens: int = 0, **_):
        import deepspeed

        self.name, self.world, self.loss_shard_tokens = name, world, loss_shard_tokens
        self.tiled = name == "alst-tiled"
        self.register(ckpt, world)
        self.model = _hf_model(ckpt, dtype)
        if self.tiled:
            for layer in self.model.model.layers:
                layer.mlp.forward = types.MethodType(_tiled_mlp_forward, layer.mlp)
        opt = build_optimizer(self.model, **OPTIM)
        # the SP ranks are one data-parallel replica: DeepSpeed's batch arithmetic counts dp ranks
        dp = world // self.mpu.get_sequence_parallel_world_size()
        self.engine, *_ = deepspeed.initialize(model=self.model, optimizer=opt, config=_ds_config(dp, dtype),
                                               mpu=self.mpu)
        self.group = self.mpu.get_sequence_parallel_group()

    @contextmanager
    def _ulysses(self):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        ALL_ATTENTION_FUNCTIONS["sdpa"] = self.attention["ulysses"]
        try:
            yield
        finally:
            ALL_ATTENTION_FUNCTIONS["sdpa"] = self.attention["plain"]

    def prepare(self, batch):
        """Every rank's loader yields the same row: the adapter shards it (and makes shift_labels)."""
        from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter

        dl = DataLoader(_Repeat(batch, 1), batch_size=None)
        adapter = UlyssesSPDataLoaderAdapter(dl, sp_rank=self.mpu.get_sequence_parallel_rank(), sp_group=self.group,
                                             sp_world_size=self.world, device="cpu")
        return next(iter(adapter))

    def _loss(self, inputs):
        if not self.tiled:  # transformers' Trainer path: the model's own loss, weighted over SP ranks
            from transformers.integrations.deepspeed import deepspeed_sp_compute_loss

            pc = types.SimpleNamespace(sp_backend="deepspeed", sp_size=self.world)
            return deepspeed_sp_compute_loss(None, self.engine, dict(inputs, use_cache=False), False, pc)
        return self._tiled_loss(inputs)

    def _tiled_loss(self, inputs):
        """ALST's tiled loss (as its trainer wires it): hidden states from the decoder, then
        TiledFusedLogitsLoss over shards of ~1 GiB of fp32 logits summing token losses, the
        rank's mean, then the token-weighted mean over the SP group."""
        from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledFusedLogitsLoss

        model, labels = self.model, inputs["shift_labels"]
        hidden = model.model(input_ids=inputs["input_ids"], position_ids=inputs["position_ids"],
                             use_cache=False).last_hidden_state  # (1, T/P, d)
        V = model.config.vocab_size
        if self.loss_shard_tokens:
            shards = math.ceil(labels.numel() / self.loss_shard_tokens)
        else:
            shards = math.ceil(labels.numel() * V * 4 / 2**30)

        def loss_sum(m, h, y):
            good = (y != -100).sum()
            if good == 0:
                return (m.lm_head(h).sum() * 0.0).float()
            return m.loss_function(logits=m.lm_head(h), labels=None, vocab_size=V, shift_labels=y) * good

        total = TiledFusedLogitsLoss.apply(loss_sum, model, hidden, labels, None, shards,
                                           [model.lm_head.weight], "sum")
        good = (labels != -100).sum()
        return sp_weighted_mean(total / good.clamp(min=1), good, self.group)

    def forward_backward(self, inputs):
        with self._ulysses():
            loss = self._loss(inputs)
            self.engine.backward(loss)
        return float(loss.detach())

    def optimizer_step(self):
        self.engine.step()

    def named_grads(self):
        return _engine_grads(dict(self.model.named_parameters()))


def sp_weighted_mean(loss: torch.Tensor, good: torch.Tensor, group) -> torch.Tensor:
    """Differentiable token-weighted mean of per-rank mean losses over the SP group (the
    aggregation of transformers' deepspeed_sp_compute_loss)."""
    from torch.distributed.nn.functional import all_gather

    losses = torch.stack(all_gather(loss, group=group))
    goods = torch.stack(all_gather(good, group=group))
    return (torch.where(goods > 0, losses, torch.zeros_like(losses)) * goods).sum() / goods.sum().clamp(min=1)


def build_order(names: list[str]) -> list[str]:
    """ALST last: its registration sets DeepSpeed's process-wide sequence-parallel state, which a
    DeepSpeed engine created afterwards in the same process takes for its own (it then leaves
    the gradients of a context-parallel model unaveraged)."""
    return [n for n in names if n not in ALST] + [n for n in names if n in ALST]


def build_contender(name: str, ckpt: str, dtype: torch.dtype, world: int, **kwargs) -> Contender:
    if name == "hf":
        return HFSingle(ckpt, dtype, **kwargs)
    if name == "ours":
        return OursSingle(ckpt, dtype, **kwargs)
    if name in ALST:
        return ALSTContender(name, ckpt, dtype, world, **kwargs)
    if name in CP:
        return OursCP(name, ckpt, dtype, world, **kwargs)
    raise ValueError(f"--impls: unknown contender {name!r}; valid: {', '.join(ALL_IMPLS)}")

