"""The packers of the `packing` modes: documents from a DocumentStream into rows (packing.py).

Three policies for a document that does not fit the rest of the row:
    carry  (default) split it: the row is filled to the end, the remainder starts the next row
           (its label at the row's last position is still its next token: nothing is lost)
    pad    pad the row and start the document on the next one; a document longer than
           seq_len is still split into seq_len pieces
    fit    as pad, but first fill the row with later documents that fit
make_packer picks the packer of a mode (Packer: carry and pad; FitPacker: fit).
At the end of a finite epoch the last partial row is padded or dropped (DataConfig.final_partial).

Why `fit`: `pad` starts a new row whenever the next document does not fit the rest of the
current one, so documents of 1/4 to 1 row leave much of a row as padding. `fit` keeps the next
`lookahead` documents of the stream in a buffer and fills the space left in a row with the
longest of them that fits (the earliest on ties), so a short document fills the gap a long one
could not (docs/data.md has the padding shares of both). Rows are padded only when no buffered
document fits. Documents are never split, except one longer than a whole row, which is cut into
row-sized pieces as `pad` does (once every buffered document is that long).

Exact resume of `fit`: the state is the stream position before the oldest document still held
(the one being split, else the oldest buffered), how many documents were read from there, and
which of them are still held; loading re-reads those documents and keeps the held ones.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from longctx.data.documents import Doc, DocumentStream
from longctx.data.packing import Row, RowBuilder


class Packer:
    """Pulls documents from a DocumentStream and emits Rows; state = where the current
    document starts in the stream + how many of its tokens were already emitted."""

    def __init__(self, stream: DocumentStream, seq_len: int, *, mode: str = "carry", pad_id: int = 0,
                 cross_document_labels: bool = False, final_partial: str = "pad", answer: bool = False):
        self.stream = stream
        self.T = int(seq_len)
        self.mode = mode
        self.pad_id = int(pad_id)
        self.cross = bool(cross_document_labels)
        self.final_partial = final_partial
        self.answer = bool(answer)
        self.doc: Optional[Doc] = None
        self.offset = 0
        self._doc_state = stream.state_dict()  # the stream state *before* self.doc
        self.done = False

    def state_dict(self) -> dict:
        if self.doc is None:
            return {"stream": self.stream.state_dict(), "offset": 0, "has_doc": False, "done": self.done}
        return {"stream": dict(self._doc_state), "offset": self.offset, "has_doc": True, "done": self.done}

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state["stream"])
        self.done = bool(state.get("done", False))
        self.doc, self.offset = None, 0
        self._doc_state = self.stream.state_dict()
        if state["has_doc"]:
            self.doc = self.stream.next_doc()  # re-reads (and re-tokenizes) its window
            if self.doc is None:
                raise RuntimeError("data loader state does not match the data: the document to resume is gone")
            self.offset = int(state["offset"])

    def _pull(self) -> bool:
        if self.doc is None:
            self._doc_state = self.stream.state_dict()
            self.doc = self.stream.next_doc()
            self.offset = 0
        return self.doc is not None

    def next_row(self) -> Optional[Row]:
        if self.done:
            return None
        T = self.T
        row = RowBuilder(T, self.pad_id, self.answer, self.cross)
        exhausted = False
        while row.fill < T:
            if not self._pull():
                exhausted = True
                break
            d, off = self.doc, self.offset
            rem = len(d) - off
            if self.mode == "pad" and rem > row.space and row.fill > 0:
                break
            take = row.put(d, off, min(rem, row.space))
            self.offset += take
            if self.offset == len(d):
                self.doc = None
        if exhausted:
            self.done = True
            if row.fill == 0 or (row.fill < T and self.final_partial == "drop"):
                return None
        return row.finish()


class FitPacker(Packer):
    """`packing: fit` (see the module doc)."""

    def __init__(self, stream: DocumentStream, seq_len: int, *, lookahead: int, pad_id: int = 0,
                 cross_document_labels: bool = False, final_partial: str = "pad", answer: bool = False):
        super().__init__(stream, seq_len, mode="fit", pad_id=pad_id, cross_document_labels=cross_document_labels,
                         final_partial=final_partial, answer=answer)
        self.lookahead = int(lookahead)
        # held documents in stream order: (read index, stream state before it, doc); the one
        # being split (self.doc, read index self._doc_read) is older than all of them
        self.buf: List[Tuple[int, dict, Doc]] = []
        self._reads = 0  # documents read from the stream so far (this packer's counter)
        self._doc_read = -1
        self._stream_end = False

    # -- state
    def state_dict(self) -> dict:
        held = ([self._doc_read] if self.doc is not None else []) + [n for n, _, _ in self.buf]
        if not held:
            return {"stream": self.stream.state_dict(), "reads": 0, "held": [], "offset": 0, "has_doc": False,
                    "done": self.done}
        oldest = held[0]
        start = self._doc_state if self.doc is not None else self.buf[0][1]
        return {"stream": dict(start), "reads": self._reads - oldest, "held": [n - oldest for n in held],
                "offset": self.offset if self.doc is not None else 0, "has_doc": self.doc is not None,
                "done": self.done}

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state["stream"])
        self.done = bool(state.get("done", False))
        self.doc, self.offset, self.buf, self._reads, self._stream_end = None, 0, [], 0, False
        held = set(int(i) for i in state["held"])
        for i in range(int(state["reads"])):
            before = self.stream.state_dict()
            d = self._read()
            if d is None:
                raise RuntimeError("data loader state does not match the data: a buffered document is gone")
            if i not in held:
                continue
            if i == 0 and state["has_doc"]:
                self.doc, self._doc_state, self._doc_read, self.offset = d, before, i, int(state["offset"])
            else:
                self.buf.append((i, before, d))

    # -- reading
    def _read(self) -> Optional[Doc]:
        d = self.stream.next_doc()
        if d is None:
            self._stream_end = True
        else:
            self._reads += 1
        return d

    def _top_up(self) -> None:
        while len(self.buf) < self.lookahead and not self._stream_end:
            before = self.stream.state_dict()
            d = self._read()
            if d is not None:
                self.buf.append((self._reads - 1, before, d))

    # -- rows
    def next_row(self) -> Optional[Row]:
        if self.done:
            return None
        T = self.T
        row = RowBuilder(T, self.pad_id, self.answer, self.cross)
        while row.fill < T:
            if self.doc is not None:  # the rest of a document longer than a row
                take = row.put(self.doc, self.offset, min(len(self.doc) - self.offset, row.space))
                self.offset += take
                if self.offset == len(self.doc):
                    self.doc = None
                continue
            self._top_up()
            if not self.buf:
                break  # the stream has ended
            fits = [i for i, (_, _, d) in enumerate(self.buf) if len(d) <= row.space]
            pick = max(fits, key=lambda i: len(self.buf[i][2])) if fits else None  # the longest (earliest on ties)
            if pick is None:
                if row.fill > 0:
                    break  # nothing held fits: pad the rest
                # every held document is longer than a row: split the oldest
                self._doc_read, self._doc_state, self.doc = self.buf.pop(0)
                self.offset = 0
                continue
            _, _, d = self.buf.pop(pick)
            row.put(d, 0, len(d))
        if row.fill < T and not self.buf and self.doc is None and self._stream_end:
            self.done = True
            if row.fill == 0 or self.final_partial == "drop":
                return None
        return row.finish()


def make_packer(stream: DocumentStream, seq_len: int, *, mode: str, lookahead: int, pad_id: int,
                cross_document_labels: bool, final_partial: str, answer: bool) -> Packer:
    """The packer for `mode` (carry | pad | fit)."""
    kw = dict(pad_id=pad_id, cross_document_labels=cross_document_labels, final_partial=final_partial, answer=answer)
    if mode == "fit":
        return FitPacker(stream, seq_len, lookahead=lookahead, **kw)
    return Packer(stream, seq_len, mode=mode, **kw)
