"""Communication primitives for context parallelism, kept apart from the attention math.

Everything works on NCCL and on gloo (so CPU tests exercise the real code paths):
point-to-point through `batch_isend_irecv`, all-gather / reduce-scatter through the
single-tensor collectives, and an all-to-all over a subset of the CP group built from
point-to-point ops (the Ulysses groups of the hybrid layout need no process groups of their
own, so nothing has to be created collectively at setup).
"""
from __future__ import annotations

import time
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

from longctx.parallel.timeouts import p2p_timeout

Tensor = torch.Tensor


def group_ranks(group: Optional[dist.ProcessGroup]) -> List[int]:
    """Global ranks of `group`, indexed by group rank."""
    return list(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))


# Process-wide counters for benchmarks: seconds spent blocked in Pending.wait (communication
# not hidden behind compute) and bytes sent point to point. Reset with reset_comm_stats().
COMM_STATS = {"wait_s": 0.0, "p2p_bytes": 0}


def reset_comm_stats() -> None:
    COMM_STATS.update(wait_s=0.0, p2p_bytes=0)


class Pending:
    """In-flight send/recv; wait() returns the received tensor, or raises as a collective that
    timed out when the peer does not answer within the collective timeout."""

    def __init__(self, works, send: Tensor, recv: Tensor):
        self._works, self._send, self.recv = works, send, recv

    def wait(self) -> Tensor:
        t0 = time.perf_counter()
        _wait_all(self._works, self.recv)
        COMM_STATS["wait_s"] += time.perf_counter() - t0
        self._works, self._send = [], None
        return self.recv


class RingComm:
    """Send to the next member of a ring, receive from the previous one."""

    def __init__(self, ranks: Sequence[int], index: int, group: Optional[dist.ProcessGroup] = None):
        self.ranks, self.index, self.size, self.group = list(ranks), index, len(ranks), group
        self.next = self.ranks[(index + 1) % self.size]
        self.prev = self.ranks[(index - 1) % self.size]

    def send_recv(self, t: Tensor, tag: int = 0) -> Pending:
        t = t.contiguous()
        recv = torch.empty_like(t)
        COMM_STATS["p2p_bytes"] += t.numel() * t.element_size()
        ops = [dist.P2POp(dist.isend, t, self.next, self.group, tag),
               dist.P2POp(dist.irecv, recv, self.prev, self.group, tag)]
        return Pending(dist.batch_isend_irecv(ops), t, recv)


def all_gather_stack(t: Tensor, group: Optional[dist.ProcessGroup]) -> Tensor:
    """(…) on every rank -> (P, …) stacked in group-rank order."""
    P = dist.get_world_size(group)
    t = t.contiguous().unsqueeze(0)  # (1, …): gathered along dim 0
    out = torch.empty((P, *t.shape[1:]), dtype=t.dtype, device=t.device)
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, t, group=group)
    return out


def reduce_scatter_stack(t: Tensor, group: Optional[dist.ProcessGroup]) -> Tensor:
    """(P, …) on every rank -> (…) = sum over ranks of their slice [group rank]."""
    t = t.contiguous()
    out = torch.empty((1, *t.shape[1:]), dtype=t.dtype, device=t.device)
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn(out, t, group=group)
    return out[0]


def all_to_all(send: Tensor, peers: Sequence[int], index: int, group: Optional[dist.ProcessGroup] = None,
               tag: int = 2) -> Tensor:
    """send (P, ...): send[i] goes to global rank peers[i]; returns recv (P, ...) with recv[i]
    from peers[i]. One buffer each way, so a caller lays out what it sends (and reads what it
    receives) without a stack of chunks.

    When the peers are exactly the group (pure Ulysses) the native all_to_all_single is used;
    a subset (a Ulysses group inside a hybrid layout) uses point-to-point ops.
    """
    send = send.contiguous()
    recv = torch.empty_like(send)
    if list(peers) == group_ranks(group):
        dist.all_to_all_single(recv, send, group=group)
        return recv
    recv[index].copy_(send[index])
    ops = []
    for i, peer in enumerate(peers):
        if i != index:
            ops.append(dist.P2POp(dist.isend, send[i], peer, group, tag))
            ops.append(dist.P2POp(dist.irecv, recv[i], peer, group, tag))
    _wait_all(dist.batch_isend_irecv(ops), recv)
    return recv


def all_to_all_v(send: Tensor, send_splits: Sequence[int], recv_splits: Sequence[int], peers: Sequence[int],
                 index: int, group: Optional[dist.ProcessGroup] = None, tag: int = 3) -> Tensor:
    """Variable-size all_to_all along dim 0: send[sum(send_splits[:i]) : +send_splits[i]] goes
    to peers[i]; returns recv (sum(recv_splits), ...) with the piece from peers[i] at its
    offset. Empty pieces are neither sent nor received. Native all_to_all_single (with splits)
    when the peers are the group, point-to-point ops for a subset (as all_to_all)."""
    send = send.contiguous()
    recv = send.new_empty((sum(recv_splits), *send.shape[1:]))
    if list(peers) == group_ranks(group):
        dist.all_to_all_single(recv, send, output_split_sizes=list(recv_splits),
                               input_split_sizes=list(send_splits), group=group)
        return recv
    s_off = [sum(send_splits[:i]) for i in range(len(peers))]
    r_off = [sum(recv_splits[:i]) for i in range(len(peers))]
    recv.narrow(0, r_off[index], recv_splits[index]).copy_(send.narrow(0, s_off[index], send_splits[index]))
    ops = []
    for i, peer in enumerate(peers):
        if i == index:
            continue
        if send_splits[i]:
            ops.append(dist.P2POp(dist.isend, send.narrow(0, s_off[i], send_splits[i]), peer, group, tag))
        if recv_splits[i]:
            ops.append(dist.P2POp(dist.irecv, recv.narrow(0, r_off[i], recv_splits[i]), peer, group, tag))
    if ops:
        _wait_all(dist.batch_isend_irecv(ops), recv)
    return recv


def _wait_all(works, recv: Tensor) -> None:
    """Point-to-point works, each held to the collective timeout. On gloo a point-to-point wait
    has no timeout of its own (a rank whose peer's node is cut off would wait for ever); on NCCL
    the process group's watchdog times it out as any collective, and a timeout given to wait()
    would block the CPU until the transfer ends (no overlap with compute)."""
    timeout = None if recv.is_cuda else p2p_timeout()
    for w in works:
        if timeout is None:
            w.wait()
        else:
            w.wait(timeout)
