"""The mixture-of-experts auxiliary (load-balancing) loss on the whole sequence.

transformers' `load_balancing_loss_func` (Mixtral, Qwen2/3-MoE, GPT-OSS) is, over every MoE
layer and every token of one forward call,

    aux = E * sum_e (C_e / N) (R_e / N)

with C_e the top-k assignments to expert e, R_e the sum of the router's softmax probabilities
for e, and N the (token, layer) rows, each counted only for the real (non-padding) tokens, as
transformers counts them given an `attention_mask`. It is a product of two means, so a shard's own aux is not
its share of the sequence's. Exact under context parallelism: C and N are summed over the
ranks that hold the sequence (no gradient flows through them), and each rank adds its own R:
the ranks' values then sum to the sequence's aux, and so do their gradients.
"""
from __future__ import annotations

from typing import Callable, List, Optional

import torch
from torch import nn

Tensor = torch.Tensor
SumOverSequence = Callable[[Tensor], Tensor]


class RouterLogits:
    """Collects each router's logits (tokens, E) during one forward call, through forward hooks on
    the modules transformers itself records them from (`_can_record_outputs["router_logits"]`)."""

    def __init__(self, model: nn.Module):
        recorder = getattr(model, "_can_record_outputs", None) or {}
        for sub in model.modules():
            recorder = {**(getattr(sub, "_can_record_outputs", None) or {}), **recorder}
        spec = recorder.get("router_logits")
        self.routers: List[nn.Module] = []
        self.logits: List[Tensor] = []
        self.recording = False
        if spec is None:
            return
        index = getattr(spec, "index", 0)
        target = getattr(spec, "target_class", None)
        for sub in model.modules():
            if target is not None and isinstance(sub, target):
                self.routers.append(sub)
                sub.register_forward_hook(self._hook(index))

    def _hook(self, index: int):
        def hook(_module, _inputs, output):
            if self.recording:  # not during an activation-checkpoint recompute in the backward
                self.logits.append(output[index] if isinstance(output, tuple) else output)
        return hook

    def __bool__(self) -> bool:
        return bool(self.routers)


def aux_loss_share(router_logits: List[Tensor], num_experts: int, top_k: int,
                   sum_over_sequence: Optional[SumOverSequence] = None,
                   token_mask: Optional[Tensor] = None) -> Tensor:
    """This rank's share of the sequence's load-balancing loss (a 0-d fp32 tensor); the shares
    of the ranks holding one sequence sum to transformers' aux loss of the whole sequence.
    token_mask (B, T) bool: the real tokens of the (B * T) rows each router saw (None: all)."""
    device = router_logits[0].device
    counts = torch.zeros(num_experts + 1, dtype=torch.float32, device=device)  # C_e, then N
    prob_sum = torch.zeros(num_experts, dtype=torch.float32, device=device)
    real = None if token_mask is None else token_mask.reshape(-1, 1).to(device, torch.float32)  # (tokens, 1)
    for logits in router_logits:
        probs = torch.softmax(logits.float(), dim=-1)  # (tokens, E)
        chosen = torch.topk(probs, top_k, dim=-1).indices  # (tokens, k)
        picks = torch.zeros_like(probs).scatter_(1, chosen, 1.0)  # (tokens, E) 1 where routed
        if real is not None:
            picks, probs = picks * real, probs * real
        counts[:num_experts] += picks.sum(0)
        counts[num_experts] += probs.shape[0] if real is None else real.sum()
        prob_sum = prob_sum + probs.sum(0)
    if sum_over_sequence is not None:
        counts = sum_over_sequence(counts)
    rows = counts[num_experts].clamp_min(1.0)  # a sequence of padding only: 0 / 1
    return num_experts * ((counts[:num_experts] / rows) * (prob_sum / rows)).sum()
