"""Our model vs transformers' LlamaForCausalLM: logits and greedy generation, every RoPE type."""
import pytest
import torch

from helpers.model import HEADS, ORIGINAL, ROPE_CASES, hf_twin, tiny_model
from longctx.model.generate import generate

TOL = 1e-4


def _max_diff(a, b):
    return (a - b).abs().max().item()


@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("rope", list(ROPE_CASES))
def test_logits_match_transformers(rope, heads):
    torch.manual_seed(0)
    ours = tiny_model(rope, heads)
    # lengths inside and 4x beyond original_max_position_embeddings
    for T in (ORIGINAL - 8, 4 * ORIGINAL):
        hf = hf_twin(tiny_model(rope, heads))  # fresh twin: dynamic/longrope keep state across calls
        ours = tiny_model(rope, heads)
        ids = torch.randint(0, 128, (2, T))
        with torch.no_grad():
            a = ours(ids)
            b = hf(input_ids=ids).logits
        assert _max_diff(a, b) <= TOL, (rope, heads, T, _max_diff(a, b))


@pytest.mark.parametrize("rope", list(ROPE_CASES))
def test_logits_match_with_noncontiguous_position_ids(rope):
    ours, hf = tiny_model(rope, "gqa"), None
    hf = hf_twin(tiny_model(rope, "gqa"))
    T = 40
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 128, (2, T), generator=g)
    # sorted random gaps, reaching past 4x the original length
    pos = torch.sort(torch.randperm(4 * ORIGINAL, generator=g)[:T]).values.expand(2, T).clone()
    pos[1] = pos[1] + 3
    with torch.no_grad():
        a = ours(ids, position_ids=pos)
        b = hf(input_ids=ids, position_ids=pos).logits
    assert _max_diff(a, b) <= TOL


@pytest.mark.parametrize("rope", ["default", "dynamic", "yarn", "llama3", "longrope"])
def test_greedy_generation_matches_transformers(rope):
    ours = tiny_model(rope, "gqa", seed=5)
    hf = hf_twin(tiny_model(rope, "gqa", seed=5))
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, 128, (1, 20), generator=g)
    with torch.no_grad():
        ref = hf.generate(prompt, max_new_tokens=32, do_sample=False, pad_token_id=0)[0, 20:].tolist()
    got = generate(ours, [prompt[0].tolist()], max_new_tokens=32)[0]
    assert got == ref


def test_batched_left_padded_generation_matches_transformers():
    ours = tiny_model("yarn", "gqa", seed=9)
    hf = hf_twin(tiny_model("yarn", "gqa", seed=9))
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(1, 128, (n,), generator=g).tolist() for n in (12, 25, 7)]
    L = max(map(len, prompts))
    ids = torch.zeros(len(prompts), L, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, L - len(p):] = torch.tensor(p)
        mask[i, L - len(p):] = 1
    with torch.no_grad():
        ref = hf.generate(ids, attention_mask=mask, max_new_tokens=32, do_sample=False, pad_token_id=0)[:, L:]
    got = generate(ours, prompts, max_new_tokens=32)
    assert got == ref.tolist()
    # a row's continuation does not depend on its batch-mates
    assert generate(ours, [prompts[2]], max_new_tokens=32)[0] == got[2]


def test_generation_stops_at_eos():
    ours = tiny_model("default", "gqa", seed=2)
    full = generate(ours, [[5, 6, 7]], max_new_tokens=16)[0]
    eos = full[3]
    cut = generate(ours, [[5, 6, 7]], max_new_tokens=16, eos_id=eos)[0]
    assert cut == full[:full.index(eos)]
