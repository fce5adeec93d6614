"""What `longctx demo` runs: the model, the training jobs (base, extension, adapter extension),
the RoPE scaling and the eval grid.

One typed schema, DemoConfig, in the training config's loader; two presets: `full` (the
default job: base and extension <= 15 min on a 2-core laptop CPU, the adapter extension about
the extension's time again) and `fast` (the CI smoke run, <= 3 min: the
same pipeline, far fewer steps and samples, accuracy meaningless). `longctx.demo.jobs` turns a
DemoConfig into the TrainConfigs of its jobs. The measurements behind each choice are in
docs/demo.md.

- Model: 3 layers, d256, 4 heads of 64, byte vocabulary, bf16 (float32 on a CPU without fast
  bf16): small enough for a 2-core CPU.
  A BPE would hold several times more text per token, which makes the short lengths too easy
  and the long ones too hard for this model.
- Base training at 256 tokens with a length curriculum (128 -> 192 -> 256; the short stages
  on passkey documents only, where copying is learned), the answer tokens weighted up,
  documents nearly as long as the row (only then does a 256-token niah document hold a
  distractor needle, and only then is key matching learned), and RULER's noise passage as
  filler (the haystack of the niah_single_1 / passkey prompts; the compact needles and
  questions are the eval's word for word). Two data-parallel processes of one thread each:
  on a busy CPU, OpenMP threads waiting for each other make one 2-thread process slower.
- Recall documents in both corpora (associative recall: short "K is: V." entries, then every
  key again) drill key matching among many needles, the skill learned slowest. In the
  extension a share of recall keys have several values, answered as a list: multivalue's
  "next value of this key".
- Half the extension's niah/multivalue/passkey documents put each needle on a line of its own
  (`line_breaks`), as the eval's haystacks do.
- Extension corpus: documents of 1x-4x the base length (only 4x made the model forget 1x), up
  to 12 keys, questions about nearly every needle of a niah document, noise + varied filler,
  multivalue and recall documents.
- Adapter extension: the same job (YaRN x4, steps, data, layout) training only LoRA on the
  attention projections plus the embeddings and norms (LongLoRA's choice), every other weight
  frozen: what an adapter run costs and buys beside the full extension.
- Extension x4 (256 -> 1024): YaRN with beta_fast 4. Its default (32, in rotations over the
  original context) is tuned for a 4096-token original length; over 256 tokens it keeps only
  the first frequency pair exact and blurs the local position signal a byte-level model relies
  on. beta_fast 4 keeps wavelengths up to 63 tokens exact and interpolates x4 every pair whose
  wavelength exceeds the original context, as YaRN does for LLaMA at 4k.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from longctx.config import load_structured
from longctx.config.adapter import AdapterSection

EVAL_TASKS = ("niah_single_1", "niah_multikey_2", "niah_multivalue", "passkey")
HEATMAP_TASK = "niah_single_1"  # evaluated on a depth grid (the heatmap)


@dataclass
class DemoStage:
    name: str
    seq_len: int
    steps: int
    tasks: Optional[Dict[str, float]] = None  # this stage's synthetic task mix; None: the config's `tasks`


def _curriculum() -> List[DemoStage]:
    # the short stages teach copying on passkey documents only (the only task whose byte-level
    # document fits 128-192 tokens), then the task mix at 256
    return [DemoStage("len128", 128, 100, {"passkey": 1.0}), DemoStage("len192", 192, 150, {"passkey": 1.0}),
            DemoStage("len256", 256, 1200)]


@dataclass
class DemoConfig:
    name: str = "full"
    # model
    hidden_size: int = 256
    num_layers: int = 3
    num_heads: int = 4
    head_dim: int = 64
    intermediate_size: int = 688
    rope_theta: float = 10000.0
    # bfloat16, float32, or auto: bfloat16 unless this CPU's bf16 GEMMs run > 2x slower than
    # float32's (AVX2-only CPUs: ~30-50x), then float32 (train/cpu_dtype.auto_dtype)
    dtype: str = "auto"
    # step 1: base training at a short context
    train_len: int = 256
    base_stages: List[DemoStage] = field(default_factory=_curriculum)
    base_batch: int = 16  # rows per step, split over base_nproc data-parallel ranks
    base_nproc: int = 2  # 2 processes x 1 thread: faster than 1 x 2 threads, and robust to a busy CPU
    # torch.compile the norms and MLPs of the base model (parallel/compiled.py): without it the
    # base does not fit its time budget
    base_compile: str = "norms_mlp"
    base_lr: float = 1e-3  # higher sits at the edge of divergence in bf16
    base_warmup: int = 30
    answer_loss_weight: float = 10.0
    # step 3: extension (continued pretraining at factor x train_len, cp=2, ZeRO-3)
    factor: int = 4
    extend_steps: int = 350
    extend_batch: int = 4  # rows of factor*train_len tokens per step (both cp ranks share each row)
    extend_lr: float = 1e-3
    extend_warmup: int = 10
    extend_checkpoint_every: int = 150
    nproc: int = 2
    cp_size: int = 2
    zero_stage: int = 3
    yarn_beta_fast: float = 4.0
    yarn_beta_slow: float = 1.0
    # step 5: the adapter extension (train.adapter): the extension's job, its steps included,
    # with LoRA r on adapter_targets and adapter_trainable trained whole, the rest frozen
    adapter_r: int = 16
    adapter_alpha: float = 32.0
    adapter_targets: List[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    adapter_trainable: List[str] = field(default_factory=lambda: ["embed_tokens", "norm"])
    # validation during the extension (validation.every / rows at extend_len), with a
    # teacher-forced retrieval probe (the eval's compact samples) on the two tasks the extended
    # model learns last: niah_single_1 and passkey are at 100 by the first validation, so they
    # would show no rise. niah_multivalue needs ~389 tokens, hence 2x and 4x, not 1x.
    extend_validation_every: int = 50
    validation_rows: int = 4
    probe_tasks: List[str] = field(default_factory=lambda: ["niah_multikey_2", "niah_multivalue"])
    probe_multipliers: List[int] = field(default_factory=lambda: [2, 4])
    probe_samples: int = 8
    # evaluation
    multipliers: List[int] = field(default_factory=lambda: [1, 2, 4, 8])
    samples: int = 30  # per task and length (random needle placement)
    heatmap_depths: List[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    heatmap_samples: int = 3  # per depth and length
    eval_seed: int = 0  # the test set is the same for every training seed
    # corpus
    num_keys: int = 4  # needles with distinct keys per niah document (1 queried, rest distractors)
    # documents at least 0.95 x seq_len long: at 256 tokens only a near-full document has room
    # for a distractor needle next to the queried one
    length_min_ratio: float = 0.95
    extend_num_keys: int = 12
    extend_length_min_ratio: float = 0.25  # extension documents from 1x to 4x the base length
    # extension filler: noise + varied sentences (the eval's essay haystack is neither; varied
    # text is closer)
    extend_filler: str = "mixed"
    extend_tasks: Dict[str, float] = field(
        default_factory=lambda: {"niah": 0.35, "multivalue": 0.25, "passkey": 0.15, "recall": 0.25})
    # questions per extension niah document, each about another needle: with 12 keys at <= 1024
    # tokens this asks about nearly every needle that fits
    extend_queries: int = 8
    recall_multivalue: float = 0.0  # share of recall keys with several values (base corpus)
    extend_recall_multivalue: float = 0.3  # the same in the extension corpus
    # share of niah/multivalue/passkey documents with each needle on a line of its own, as the
    # eval's haystacks separate their units with newlines (base corpus; the extension's below)
    line_breaks: float = 0.0
    extend_line_breaks: float = 0.5
    extend_packing: str = "pad"  # `fit` (filling a row's leftover space) measured no better
    num_values: int = 4  # niah_multivalue asks for 4 values of one key
    filler: str = "noise"  # RULER's noise passage: the haystack of niah_single_1 and passkey
    # base mix at 256 (multivalue does not fit 256 tokens; recall drills key matching)
    tasks: Dict[str, float] = field(default_factory=lambda: {"niah": 0.35, "recall": 0.45, "passkey": 0.2})

    @property
    def lengths(self) -> List[int]:
        return [m * self.train_len for m in self.multipliers]

    @property
    def probe_lengths(self) -> List[int]:
        return [m * self.train_len for m in self.probe_multipliers]

    @property
    def extend_len(self) -> int:
        return self.factor * self.train_len

    def adapter(self) -> AdapterSection:
        """The adapter run's train.adapter."""
        return AdapterSection(type="lora", r=self.adapter_r, alpha=self.adapter_alpha, dropout=0.0,
                              target_modules=list(self.adapter_targets), trainable=list(self.adapter_trainable))

    def model_overrides(self, tokenizer) -> Dict[str, Any]:
        return {"vocab_size": tokenizer.vocab_size, "hidden_size": self.hidden_size,
                "num_hidden_layers": self.num_layers,
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


# The CI smoke run: every step of the pipeline for real (curriculum, torchrun cp=2 + ZeRO-3,
# checkpoints, HF exports, eval at 1x..8x, report), with token-sized budgets.
PRESETS: Dict[str, Dict[str, Any]] = {
    "full": {},
    "fast": {"base_stages": [{"name": "len192", "seq_len": 192, "steps": 6, "tasks": {"passkey": 1.0}},
                             {"name": "len256", "seq_len": 256, "steps": 10}],
             "base_batch": 8, "base_warmup": 2, "extend_steps": 4, "extend_batch": 2, "extend_warmup": 1,
             "extend_checkpoint_every": 2, "extend_validation_every": 2, "validation_rows": 2, "probe_samples": 1,
             "samples": 2, "heatmap_depths": [0.0, 1.0], "heatmap_samples": 1},
}


def demo_config(preset: str = "full") -> DemoConfig:
    """A preset's DemoConfig, through the training config's loader (types checked)."""
    return load_structured(DemoConfig, values={**PRESETS[preset], "name": preset}, prefix="demo.")


FULL = demo_config("full")
FAST = demo_config("fast")
