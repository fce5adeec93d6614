"""Load exported model directories with whichever transformers this interpreter has, and run
each on its inputs in order: `python hf_export_logits.py CASES.json REPORT.json`. Needs only
torch and transformers (no longctx), so an interpreter with another transformers version runs it.

CASES.json: [{"dir": ..., "inputs": [{"input_ids": [[...]], "position_ids": [[...]] | null}, ...],
"out": FILE.pt}, ...]. FILE.pt holds the list of logits (B, T, V) in fp32, one per input, from one
loaded model (so dynamic RoPE's state carries from one input to the next, as in a session).
REPORT.json: the transformers version and, per case, the class transformers built and its RoPE
frequencies and attention scale after the last input, or the error that loading or running raised.
"""
import json
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM


def _load(directory: str):
    # transformers 4.x names the dtype argument torch_dtype; 5.x renamed it dtype
    major = int(transformers.__version__.split(".")[0])
    dtype_arg = {"dtype": torch.float32} if major >= 5 else {"torch_dtype": torch.float32}
    return AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager", **dtype_arg).eval()


def _run(case: dict) -> dict:
    model = _load(case["dir"])
    outputs = []
    for x in case["inputs"]:
        ids = torch.tensor(x["input_ids"])  # (B, T)
        pos = torch.tensor(x["position_ids"]) if x.get("position_ids") is not None else None
        with torch.no_grad():
            outputs.append(model(input_ids=ids, position_ids=pos).logits.float())  # (B, T, V)
    torch.save(outputs, case["out"])
    rotary = model.model.rotary_emb
    return {"class": type(model).__name__, "attention_scaling": float(rotary.attention_scaling),
            "inv_freq": rotary.inv_freq.float().tolist()}


def run_cases(cases: list[dict]) -> dict:
    report = {"transformers": transformers.__version__, "cases": []}
    for case in cases:
        try:
            result = _run(case)
        except Exception as e:  # reported per case: one export that fails hides no other
            result = {"error": f"{type(e).__name__}: {e}"}
        report["cases"].append({"dir": case["dir"], **result})
    return report


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        report = run_cases(json.load(f))
    with open(sys.argv[2], "w") as f:
        json.dump(report, f)
