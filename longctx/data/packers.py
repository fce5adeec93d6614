"""The packer of a `packing` mode: carry and pad (packing.py), fit (fit_packing.py)."""
from __future__ import annotations

from longctx.data.documents import DocumentStream
from longctx.data.fit_packing import FitPacker
from longctx.data.packing import Packer


def make_packer(stream: DocumentStream, seq_len: int, *, mode: str, lookahead: int, pad_id: int,
                cross_document_labels: bool, final_partial: str, answer: bool) -> Packer:
    """The packer for `mode` (carry | pad | fit; fit_packing.py has the third)."""
    kw = dict(pad_id=pad_id, cross_document_labels=cross_document_labels, final_partial=final_partial, answer=answer)
    if mode == "fit":
        return FitPacker(stream, seq_len, lookahead=lookahead, **kw)
    return Packer(stream, seq_len, mode=mode, **kw)
