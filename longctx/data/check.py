"""Read every source the way the loader will, before a run creates or touches its directory.

    check_data(stage.data, tokenizer)      # UserError (one line naming the file and row) or None

A map-style file or hub source is loaded through 🤗 datasets here (the loader then finds its
cache) and its text column checked: every value text, every value valid UTF-8. A streaming
source is opened and its first window of rows read; a bad row further on is named by file and
row when the loader reaches it. A source whose pre-tokenized cache (`cache_dir`) is already
built for its current content is not read again, and synthetic sources need nothing.
"""
from __future__ import annotations

import itertools
import os

from longctx.data.cache import cache_path
from longctx.data.config import DataConfig, as_data_config, validate_data_config
from longctx.data.loader import check_special_tokens
from longctx.data.source_config import resolve_kind
from longctx.data.sources import open_table
from longctx.data.tokenizer import load_tokenizer


def check_data(data_cfg: DataConfig, tokenizer=None) -> None:
    """Raise the UserError the loader would raise on any source of `data_cfg` (see the module
    doc). `tokenizer`: the run's tokenizer, or None to load `data_cfg.tokenizer`."""
    cfg = as_data_config(data_cfg)
    validate_data_config(cfg)
    tok = tokenizer if tokenizer is not None else load_tokenizer(cfg.tokenizer)
    check_special_tokens(cfg, tok)
    for i, src in enumerate(cfg.sources):
        if resolve_kind(src, i) == "synthetic" or _cached(cfg, src, i, tok):
            continue
        table = open_table(src, i, cfg, tok)  # map-style: loaded and its text column checked
        if table.streaming:
            for _ in itertools.islice(table.open(None, 0), cfg.shuffle_window):
                pass


def _cached(cfg: DataConfig, src, i: int, tokenizer) -> bool:
    """True when the pre-tokenized cache of source i is built for its current content."""
    return bool(cfg.cache_dir) and os.path.exists(os.path.join(cache_path(src, i, cfg, tokenizer), "meta.json"))
