"""Checkpoints: what a run saves, how it comes back, and which model a directory holds.

    store.py         save (atomic, MANIFEST + COMPLETE), verify, resume candidates and fallback, load
    resume.py        the resume path top to bottom: which checkpoint, where the run continues, restore
    state.py         TrainerState: the typed trainer_state.json, built in one place
    layout.py        a checkpoint's layout and the checks and resharding for another one
    universal.py     DeepSpeed universal checkpoints (resume at another ZeRO stage or world size)
    continuation.py  where a resumed run continues when its stages changed
    manifest.py      MANIFEST.json: every file's size and SHA-256
    safe_load.py     torch files read with the weights_only unpickler (allow-listed types): no code runs
    model.py         which model a checkpoint holds; its ZeRO shards consolidated
    find.py          any directory a user points at (HF, checkpoint, run, Hub id) -> a model
    export.py        `longctx export`'s work: any of those as an HF directory with its tokenizer

Train and eval use this package; nothing here imports train/ or eval/.
"""
