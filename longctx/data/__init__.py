"""Data pipeline: tokenizers, 🤗 datasets sources, packing with document boundaries,
weighted mixtures, exact resume, the built-in synthetic corpus and a pre-tokenized cache.
See docs/data.md."""
from longctx.base.labels import IGNORE_INDEX
from longctx.base.lazy_exports import exported_names, lazy_exports

_EXPORTS = {
    "check": ["check_data"],
    "config": ["DataConfig", "as_data_config", "validate_data_config"],
    "fingerprint": ["changed_sources", "compare_sources", "fingerprint_sources"],
    "loader": ["DataLoader", "build_loader"],
    "source_config": ["SourceConfig", "UpsampleBucket"],
    "synthetic": ["SyntheticCorpus", "SyntheticDocument", "generate_document"],
    "synthetic_config": ["SyntheticConfig"],
    "tokenizer": ["ByteTokenizer", "HFTokenizer", "check_vocab", "load_tokenizer"],
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = [*exported_names(_EXPORTS), "IGNORE_INDEX"]
