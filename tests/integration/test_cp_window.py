"""A sliding-window model under context parallelism (cp=2, gloo): positions past the window are
one UserError naming what reached them, raised by every rank together before any collective --
not one rank raising on its shard while its peer waits in the ring (a stall until the
collective's timeout). Positions within the window run as before."""
import torch

from helpers.cp import run_distributed
from longctx.base.errors import UserError
from longctx.eval.ppl import window_nll
from longctx.model.config import get_preset
from longctx.model.llama import build_model, window_positions
from longctx.parallel.cp_decode import cp_generate

WINDOW = 32


def _outcome(fn) -> str:
    try:
        fn()
        return "ran"
    except UserError as e:
        return str(e)


def _worker(rank, world):
    import torch.distributed as dist

    model = build_model(get_preset("debug-tiny-mistral").replace(sliding_window=WINDOW), seed=0).eval()
    group = dist.group.WORLD
    # 36 positions in zigzag chunks of 9: rank 0 holds 0-8 and 27-35 (past the window), rank 1 holds
    # 9-26 (within it): checked on its shard, only rank 0 would raise
    fits, long = [list(range(1, 25))], [list(range(1, 37))]  # 24 + 8 new tokens fit 32
    past = torch.ones(1, 36, dtype=torch.long)
    return {"generate within": _outcome(lambda: cp_generate(model, fits, 8, group=group)),
            "generate past": _outcome(lambda: cp_generate(model, long, 1, group=group)),
            "ppl within": _outcome(lambda: window_nll(model, torch.ones(1, WINDOW, dtype=torch.long), cp_group=group)),
            "ppl past": _outcome(lambda: window_nll(model, past, cp_group=group))}


def test_positions_past_the_window_are_every_cp_rank_s_error_before_any_collective():
    # the gloo group's timeout (120 s) is past this limit: a rank left in the ring fails the test
    results = run_distributed(_worker, 2, timeout=100)
    for outcomes in results:
        assert outcomes["generate within"] == outcomes["ppl within"] == "ran"
        assert outcomes["generate past"].startswith(
            "sliding_window: the prompt and its new tokens (max_new_tokens) reach position 35, past the model's "
            f"window of {WINDOW} tokens"), outcomes
        assert outcomes["ppl past"].startswith(
            "sliding_window: the perplexity windows (eval.ppl_lengths) reach position 35"), outcomes


def test_a_training_batch_past_the_window_names_its_position_ids():
    config = get_preset("debug-tiny-mistral").replace(sliding_window=WINDOW)
    window_positions(config, torch.arange(WINDOW)[None], "a training batch's position_ids")  # 0..31: within
    try:
        window_positions(config, torch.arange(WINDOW + 1)[None], "a training batch's position_ids")
    except UserError as e:
        assert str(e).startswith("sliding_window: a training batch's position_ids reach position 32"), e
    else:
        raise AssertionError("no error past the window")
    window_positions(get_preset("debug-tiny"), torch.arange(10_000)[None], "unused")  # no window: no limit
