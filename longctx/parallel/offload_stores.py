"""Where offloaded block inputs wait for their backward (parallel/activation_offload.py):
`HostStore` copies into pooled host buffers (pinned, on a side stream, on CUDA); `DiskStore`
writes to `<dir>/activations-rank{R}-...bin` by one I/O thread and prefetches the previous
block's input. The file is unlinked as soon as it is open, so the space is released when the
process ends however it ends; `remove_stale` removes a file a killed process left between create
and unlink (its owner no longer runs on this host). The bytes come back exactly as they left."""
from __future__ import annotations

import atexit
import logging
import os
import re
import socket
import threading
import weakref
from abc import ABC, abstractmethod
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from longctx.storage.locks import Holder, is_alive, process_start

log = logging.getLogger(__name__)
Tensor = torch.Tensor

FILE_PATTERN = re.compile(r"^activations-rank(\d+)-(\d+)-(\d+|x)@(.+)\.bin$")
ALIGN = 4096  # file offsets of the slots (page aligned)
MAX_IO = 1 << 30  # bytes per pread/pwrite call (Linux moves at most ~2 GiB per call)


@dataclass(frozen=True)
class Packed:
    """What autograd holds instead of a block input: the store's key and the tensor's metadata."""

    index: int
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device

    @property
    def nbytes(self) -> int:
        return self.shape.numel() * self.dtype.itemsize


class Handle:
    """A packed tensor's handle: its lifetime (autograd dropping it) releases its store slot."""

    __slots__ = ("meta", "__weakref__")

    def __init__(self, meta: Packed) -> None:
        self.meta = meta


def _bytes_of(t: Tensor) -> Tensor:
    """A contiguous tensor's storage as a flat uint8 tensor (no copy)."""
    return t.reshape(-1).view(torch.uint8)


def _as_tensor(raw: Tensor, meta: Packed) -> Tensor:
    """Flat uint8 bytes -> the tensor `meta` describes (same device as `raw`, no copy)."""
    return raw.view(meta.dtype).view(meta.shape)


class _PinnedPool:
    """Reusable pinned host buffers by size (CUDA), so host memory is flat after the first step
    (pinning is slow; on CPU a buffer is plain memory, taken fresh and never pooled). A buffer
    returns with the CUDA event of its last copy; it is reused once that has finished."""

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self.free: dict[int, list] = {}
        self.lock = threading.Lock()

    def take(self, nbytes: int) -> Tensor:
        with self.lock:
            stack = self.free.get(nbytes)
            entry = stack.pop() if stack else None
        if entry is None:
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)
        buf, event = entry
        if event is not None:
            event.synchronize()
        return buf

    def give(self, buf: Tensor, event=None) -> None:
        if not self.pin:
            return
        with self.lock:
            self.free.setdefault(buf.numel(), []).append((buf, event))

    def clear(self) -> None:
        with self.lock:
            self.free.clear()


class Store(ABC):
    """The slots of packed block inputs and their way back (subclasses: host, disk).

    `put` takes a block input and returns its handle; `get` returns the tensor on its device
    and starts bringing back the input packed just before it (the next block of the backward).
    A slot lives until `get` or until autograd drops the handle (a forward without backward)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.side = torch.cuda.Stream(device) if self.cuda else None
        self.pool = _PinnedPool(pin=self.cuda)
        self.entries: dict[int, dict] = {}  # index -> the slot's buffers / futures
        self.lock = threading.Lock()
        self.next_index = 0
        self.stats = {"put": 0, "get": 0, "prefetched": 0, "bytes_out": 0, "peak_live_bytes": 0}
        self.live_bytes = 0

    # -- the hooks' side ------------------------------------------------------------------
    def put(self, t: Tensor) -> Handle:
        t = t.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        with self.lock:
            index = self.next_index
            self.next_index += 1
        meta = Packed(index, t.shape, t.dtype, t.device)
        entry = self._store(t, meta)
        with self.lock:
            self.entries[index] = entry
            self.live_bytes += meta.nbytes
            self.stats["put"] += 1
            self.stats["bytes_out"] += meta.nbytes
            self.stats["peak_live_bytes"] = max(self.stats["peak_live_bytes"], self.live_bytes)
        handle = Handle(meta)
        weakref.finalize(handle, self.release, index)
        return handle

    def get(self, handle: Handle) -> Tensor:
        meta = handle.meta
        with self.lock:
            entry = self.entries.get(meta.index)
        if entry is None:
            raise RuntimeError(f"activation offload: block input {meta.index} was already restored or released "
                               "(each forward's activations are used by one backward)")
        out = self._restore(entry, meta)
        self.release(meta.index)
        self.stats["get"] += 1
        previous = self._previous(meta.index)
        if previous is not None:
            self._prefetch(previous)
        return out

    def _previous(self, index: int) -> Optional[dict]:
        """The entry of the live slot packed last before `index` (the block whose backward comes
        next), None when there is none or it is already on its way back."""
        with self.lock:
            earlier = [i for i in self.entries if i < index]
            if not earlier:
                return None
            entry = self.entries[max(earlier)]
        return None if entry.get("prefetch") is not None else entry

    def release(self, index: int) -> None:
        with self.lock:
            entry = self.entries.pop(index, None)
            if entry is None:
                return
            self.live_bytes -= entry["meta"].nbytes
            empty = not self.entries
        self._free(entry, empty)

    def close(self) -> None:
        with self.lock:
            entries, self.entries = list(self.entries.values()), {}
            self.live_bytes = 0
        for entry in entries:
            self._free(entry, True)
        self.pool.clear()

    # -- CUDA copies on the side stream -----------------------------------------------------
    def _to_host(self, t: Tensor, meta: Packed):
        """t on the device -> a pooled host buffer; returns (buffer, event or None)."""
        buf = self.pool.take(meta.nbytes)
        if not self.cuda:
            _as_tensor(buf, meta).copy_(t)
            return buf, None
        self.side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.side):
            _as_tensor(buf, meta).copy_(t, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.side)
        t.record_stream(self.side)  # its memory is not reused before the copy has read it
        return buf, event

    def _to_device(self, buf: Tensor, meta: Packed, after=None):
        """A host buffer -> a new device tensor, copied on the side stream; returns (tensor, event).
        The tensor is allocated on the side stream (so its memory is not one the compute stream
        may still be using); _wait hands it to the compute stream."""
        with torch.cuda.stream(self.side):
            out = torch.empty(meta.shape, dtype=meta.dtype, device=self.device)
            if after is not None:
                self.side.wait_event(after)
            out.copy_(_as_tensor(buf, meta), non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.side)
        return out, event

    def _wait(self, out: Tensor, event) -> Tensor:
        """The compute stream waits for a side-stream copy into `out` (CUDA); `out`'s memory is not
        reused before the compute stream is done with it."""
        current = torch.cuda.current_stream(self.device)
        current.wait_event(event)
        out.record_stream(current)
        return out

    # -- per kind ------------------------------------------------------------------------------
    @abstractmethod
    def _store(self, t: Tensor, meta: Packed) -> dict:
        """Start moving `t` off the device; returns the slot's entry (its "meta" and "prefetch": None)."""

    @abstractmethod
    def _restore(self, entry: dict, meta: Packed) -> Tensor:
        """The slot's tensor on the device (waiting for its prefetch when one runs)."""

    @abstractmethod
    def _prefetch(self, entry: dict) -> None:
        """Start bringing the slot back (its entry's "prefetch")."""

    @abstractmethod
    def _free(self, entry: dict, empty: bool) -> None:
        """Give the slot's storage back (`empty`: no slot is live any more)."""


class HostStore(Store):
    """Block inputs in host buffers (pinned on CUDA, copied on a side stream)."""

    def _store(self, t: Tensor, meta: Packed) -> dict:
        buf, event = self._to_host(t, meta)
        return {"meta": meta, "buf": buf, "event": event, "prefetch": None}

    def _prefetch(self, entry: dict) -> None:
        if self.cuda:  # on CPU the copy back is a memcpy in get(): nothing to overlap
            entry["prefetch"] = self._to_device(entry["buf"], entry["meta"], after=entry["event"])
            self.stats["prefetched"] += 1

    def _restore(self, entry: dict, meta: Packed) -> Tensor:
        if not self.cuda:
            return _as_tensor(entry["buf"], meta)  # never pooled on CPU: the buffer becomes the input
        out, event = entry["prefetch"] or self._to_device(entry["buf"], meta, after=entry["event"])
        entry["last_use"] = event
        return self._wait(out, event)

    def _free(self, entry: dict, empty: bool) -> None:  # noqa: ARG002
        self.pool.give(entry["buf"], entry.get("last_use") or entry["event"])


class DiskStore(Store):
    """Block inputs in one file per rank, written and read by one I/O thread (in order, so a read
    always follows its write). Slots are page-aligned; the file's space is reused from offset 0
    whenever no slot is live (after every backward)."""

    def __init__(self, device: torch.device, directory: Path, rank: int) -> None:
        super().__init__(device)
        directory.mkdir(parents=True, exist_ok=True)
        remove_stale(directory)
        start = process_start(os.getpid())
        name = f"activations-rank{rank}-{os.getpid()}-{'x' if start is None else start}@{socket.gethostname()}.bin"
        self.path = directory / name
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.unlink(self.path)  # the space goes with the last descriptor: no file outlives the process
        self.io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="longctx-offload")
        self.end = 0  # the next free offset
        self.file_peak = 0
        atexit.register(self.close)

    def _store(self, t: Tensor, meta: Packed) -> dict:
        with self.lock:
            offset = self.end
            self.end += -(-meta.nbytes // ALIGN) * ALIGN
            self.file_peak = max(self.file_peak, self.end)
        if self.cuda:
            buf, event = self._to_host(t, meta)
            written = self.io.submit(self._write_after, buf, event, offset)
        else:  # the tensor itself is written; it is freed once the write has read it
            written = self.io.submit(_write_all, self.fd, _bytes_of(t).numpy(), offset)
        return {"meta": meta, "offset": offset, "written": written, "prefetch": None}

    def _write_after(self, buf: Tensor, event, offset: int) -> None:
        event.synchronize()
        _write_all(self.fd, buf.numpy(), offset)
        self.pool.give(buf)

    def _read(self, meta: Packed, offset: int) -> Tensor:
        buf = self.pool.take(meta.nbytes)
        _read_all(self.fd, buf.numpy(), offset)
        return buf

    def _prefetch(self, entry: dict) -> None:
        entry["prefetch"] = self.io.submit(self._read, entry["meta"], entry["offset"])
        self.stats["prefetched"] += 1

    def _restore(self, entry: dict, meta: Packed) -> Tensor:
        future: Future = entry["prefetch"] or self.io.submit(self._read, meta, entry["offset"])
        entry["written"].result()  # a write error surfaces here
        buf = future.result()
        if not self.cuda:
            return _as_tensor(buf, meta)
        out, event = self._to_device(buf, meta)
        self.pool.give(buf, event)
        return self._wait(out, event)

    def _free(self, entry: dict, empty: bool) -> None:
        if empty:
            with self.lock:
                if not self.entries:
                    self.end = 0

    def close(self) -> None:
        atexit.unregister(self.close)
        super().close()
        io, self.io = getattr(self, "io", None), None
        if io is not None:
            io.shutdown(wait=True)
        fd, self.fd = getattr(self, "fd", -1), -1
        if fd >= 0:
            os.close(fd)


def _write_all(fd: int, data, offset: int) -> None:
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:done + MAX_IO], offset + done)


def _read_all(fd: int, data, offset: int) -> None:
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:done + MAX_IO]], offset + done)
        if n == 0:
            raise RuntimeError(f"activation offload: the offload file ended at byte {offset + done}")
        done += n


def remove_stale(directory: Path) -> list[Path]:
    """Offload files in `directory` whose owner on this host no longer runs (a killed process
    between creating and unlinking its file): removed, and returned. Files of live owners and of
    other hosts are left alone (their names never collide with ours: they carry host and pid)."""
    removed = []
    for path in directory.iterdir():
        match = FILE_PATTERN.match(path.name)
        if match is None:
            continue
        _, pid, start, host = match.groups()
        holder = Holder(host, int(pid), None if start == "x" else int(start), 0.0)
        if is_alive(holder) is False:
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            log.warning("removed a stale activation offload file of a process that no longer runs: %s", path)
            removed.append(path)
    return removed
