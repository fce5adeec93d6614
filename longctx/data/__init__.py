"""Data pipeline: tokenizers, 🤗 datasets sources, packing with document boundaries,
weighted mixtures, exact resume, the built-in synthetic corpus and a pre-tokenized cache.
See docs/data.md."""
from longctx.data.check import check_data
from longctx.data.config import DataConfig, SourceConfig, SyntheticConfig, UpsampleBucket, validate_data_config
from longctx.data.fingerprint import changed_sources, compare_sources, fingerprint_sources
from longctx.data.loader import DataLoader, as_data_config, build_loader
from longctx.data.synthetic import SyntheticCorpus, SyntheticDocument, generate_document
from longctx.data.tokenizer import ByteTokenizer, HFTokenizer, check_vocab, load_tokenizer
from longctx.labels import IGNORE_INDEX

__all__ = [
    "DataConfig", "SourceConfig", "SyntheticConfig", "UpsampleBucket", "validate_data_config",
    "DataLoader", "as_data_config", "build_loader", "IGNORE_INDEX",
    "SyntheticCorpus", "SyntheticDocument", "generate_document",
    "ByteTokenizer", "HFTokenizer", "check_vocab", "load_tokenizer", "check_data", "fingerprint_sources",
    "compare_sources", "changed_sources",
]
