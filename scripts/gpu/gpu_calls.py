"""The plan of device calls (docs/gpu.md, docs/real_model.md) and the check that every call fits the
lending rules, read from the scripts' own settings:

- what a call carries (the repository's tracked and untracked-not-ignored files, plus its carried
  paths) is at most 64 MiB;
- its timeout_s is at most 600 s, and its script's budget ends at least 60 s before it: the
  install allowance, every step's limit with its kill grace, and the summary fit in budget_s
  (gpu_env.sh's INSTALL_S, KILL_S, SUMMARY_S; the script's `budget_s` and `step`/`cuda_step` lines);
- what comes back is at most 8 files, at most 2 folders down, each named in [A-Za-z0-9._-]:
  gpu_env.sh packs the output folder to summary.md, steps.tsv, the script's `keep` files and one
  rest.tar.gz;
- each session (calls back to back on one warm machine) fits the 15 minutes of device time with
  the machine's start, and runs a call only after the calls that land what it needs.

    python scripts/gpu/gpu_calls.py check [--strict] [--call NAME]   # every call (or one): all rules
    python scripts/gpu/gpu_calls.py carry NAME                       # the literal carry list of a call
    python scripts/gpu/gpu_calls.py plan                             # the plan as docs/gpu.md shows it
    python scripts/gpu/gpu_calls.py returned OUT                     # what came back (or would): the rules

A carried path that is not here (the wheels are built by scripts/gpu/gpu_wheels.sh, the GGUF and the
text by docs/real_model.md's scripts) is counted at its declared size cap; --strict refuses that.
Exit 0 when every rule holds, 1 when one does not, 2 on bad input.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "scripts" / "gpu"
MiB = 1024 * 1024

# the lending rules (/work/.library/device/README.md as the issue states them)
CARRY_MIB = 64
TIMEOUT_MAX_S = 600
MARGIN_S = 60            # a call ends by itself this long before its timeout_s
FILES_BACK = 8
DEPTH_BACK = 2           # $OUT/a/b/file comes back, $OUT/a/b/c/file does not
FILE_BACK_MIB = 16
TOTAL_BACK_MIB = 64
SESSION_S = 900          # device time of a session, the machine's start and idle time included
START_S = 120            # a fresh machine's start, counted in the session's time
PER_CALL_S = 15          # transfers and the warm wait between calls
NAME_OK = re.compile(r"^[A-Za-z0-9._-]+$")


@dataclass(frozen=True)
class Carried:
    """A carried path (a glob: gpu_wheels.sh's names carry versions) and its size cap in MiB, what
    it is counted at when it is not here."""
    path: str
    cap_mib: float
    what: str


def piece_mib() -> float:
    """gpu_wheels.sh's PIECE_MIB default: the size of each piece of the CuTe DSL libraries."""
    m = re.search(r"piece_mib=\$\{PIECE_MIB:-(\d+)\}", (GPU / "gpu_wheels.sh").read_text())
    return float(m.group(1))


TRAINER = Carried(".whl/trainer", 8, "DeepSpeed, omegaconf, pydantic, datasets, gguf wheels")
FA4 = Carried(".whl/fa4", 12, "FlashAttention-4 and its CuTe DSL wheels")
PIECE_A = Carried(".whl/parts/*.part-aa", piece_mib(), "the CuTe DSL CUDA 13 libraries, piece 1")
PIECE_B = Carried(".whl/parts/*.part-ab", piece_mib(), "the CuTe DSL CUDA 13 libraries, piece 2")
PIECES = Carried(".whl/parts/*.parts", 0.01, "the pieces' manifest")
GGUF_A = Carried("models/gguf/SmolLM2-135M-Instruct.Q4_1.gguf.part-aa", 47, "the SmolLM2 GGUF, part 1")
GGUF_B = Carried("models/gguf/SmolLM2-135M-Instruct.Q4_1.gguf.part-ab", 47, "the SmolLM2 GGUF, part 2")
GGUF_SUM = Carried("models/gguf/SmolLM2-135M-Instruct.Q4_1.gguf.sha256", 0.01, "the GGUF's SHA-256")
HELDOUT = Carried("data/longtext/heldout.jsonl.xz", 8, "the held-out text, xz")
TEXT = Carried("data/longtext/train.jsonl.xz", 39, "the training text, xz (~37.6 MiB measured on a prefix)")
SHORT = Carried("data/longtext/short.jsonl.xz", 19, "the short documents, xz")


@dataclass(frozen=True)
class Call:
    name: str
    script: str                      # under scripts/gpu/
    out: str                         # the output folder under $OUT
    timeout_s: int
    carry: tuple[Carried, ...]
    needs: tuple[str, ...] = ()      # calls that must run before it on the same warm machine
    args: str = ""
    does: str = ""

    @property
    def command(self) -> str:
        return f"bash scripts/gpu/{self.script} $OUT/{self.out}" + (f" {self.args}" if self.args else "")


CALLS = {c.name: c for c in (
    Call("check", "gpu_check.sh", "check", 410, (TRAINER, PIECE_A, PIECES),
         does="test_device.py, longctx train ZeRO-0/2 at 16k; lands FA4's piece 1"),
    Call("doc", "gpu_doc_attention.sh", "doc", 390, (FA4, PIECE_B, PIECES), needs=("check",),
         does="document attention, every kernel incl. FlashAttention-4"),
    Call("bench", "gpu_bench_train.sh", "bench", 410, (TRAINER,),
         does="bench_train.py: longctx vs transformers at 8k, 32k, 128k"),
    Call("recipe", "gpu_recipe_speed.sh", "recipe", 380, (TRAINER, FA4, PIECE_B, PIECES), needs=("check",),
         does="the 32k recipe's speed: trainer vs the model step alone"),
    Call("profile", "gpu_profile_step.sh", "profile", 310, (TRAINER,),
         does="torch.profiler: where a step's time goes, longctx and transformers"),
    Call("gguf-land", "gpu_land.sh", "land", 110, (TRAINER, GGUF_A, GGUF_SUM),
         does="lands the trainer wheels and the GGUF's part 1"),
    Call("smollm2-zero-shot", "gpu_smollm2_32k.sh", "zs", 390, (GGUF_B, GGUF_SUM, HELDOUT), needs=("gguf-land",),
         args="zero-shot", does="SmolLM2 from the GGUF; zero-shot YaRN x4: perplexity and RULER at 32k"),
    Call("smollm2-train", "gpu_smollm2_32k.sh", "train", 390, (TEXT, SHORT), needs=("smollm2-zero-shot",),
         args="train", does="the 32k recipe for TRAIN_S, then the trained model's perplexity and RULER"),
    Call("study-zero-shot", "gpu_study_zero_shot.sh", "zs", 590, (GGUF_B, GGUF_SUM), needs=("gguf-land",),
         does="SmolLM2 from the GGUF; the study's zero-shot 128k/64k cells"),
    Call("study-model", "gpu_study_model.sh", "model", 210, (GGUF_B, GGUF_SUM), needs=("gguf-land",),
         does="SmolLM2 from the GGUF, for the training calls after it"),
    Call("study-trained", "gpu_study_trained.sh", "trained", 320, (TEXT, SHORT), needs=("study-model",),
         does="the study's 64k training, evaluated"),
    Call("study-control", "gpu_study_control.sh", "control", 290, (), needs=("study-trained",),
         does="the study's 8k control with the trained run's steps and tokens, evaluated"),
)}

# sessions: calls back to back on one warm machine, within one session's device time
SESSIONS = {
    "attention": ("check", "doc"),
    "trainer-vs-transformers": ("check", "bench"),
    "recipe-speed": ("check", "recipe"),
    "profile": ("profile",),
    "smollm2-32k": ("gguf-land", "smollm2-zero-shot", "smollm2-train"),
    "study-zero-shot": ("gguf-land", "study-zero-shot"),
    "study-train": ("gguf-land", "study-model", "study-trained", "study-control"),
}


# -- what the scripts say -------------------------------------------------------------------------------

def _default(text: str, var: str) -> int:
    """The default of `var=${ENV:-N}` or `var=N` in a script."""
    m = re.search(rf"^{var}=(?:\$\{{\w+:-(\d+)\}}|(\d+))", text, re.M)
    if not m:
        raise ValueError(f"no {var}=... setting")
    return int(m.group(1) or m.group(2))


def _limit(token: str) -> int:
    m = re.fullmatch(r'"?\$\{\w+:-(\d+)\}"?|(\d+)', token)
    if not m:
        raise ValueError(f"step limit {token!r} is neither a number nor ${{VAR:-N}}")
    return int(m.group(1) or m.group(2))


@dataclass
class Script:
    """A device script's own settings, read from its text."""
    name: str
    budget_s: int
    keep: list[str]
    steps: list[tuple[str, int]]
    sources_env: bool
    env: dict = field(default_factory=dict)

    @classmethod
    def read(cls, name: str, phase: str = "") -> "Script":
        """`phase`: the call's argument; a step line tagged `# phase: X` counts only for phase X."""
        text = (GPU / name).read_text()
        env_text = (GPU / "gpu_env.sh").read_text()
        env = {k: _default(env_text, k) for k in ("INSTALL_S", "KILL_S", "SUMMARY_S")}
        keep = re.search(r'^keep="([^"]*)"', text, re.M)
        steps = [(m.group(2), _limit(m.group(3)))
                 for m in re.finditer(r"^\s*(step|cuda_step) (\S+) (\S+)[^#\n]*(?:#\s*phase:\s*(\S+))?", text, re.M)
                 if m.group(4) in (None, phase)]
        sources = bool(re.search(r"^(\.|source) .*gpu_(env|study_common)\.sh", text, re.M))
        if name.startswith("gpu_study") and "gpu_study_common.sh" in text:
            sources = True
        return cls(name, _default(text, "budget_s"), keep.group(1).split() if keep else [], steps, sources, env)

    @property
    def needed_s(self) -> int:
        """What the script's steps may take, with the install and the summary."""
        return (self.env["INSTALL_S"] + sum(limit + self.env["KILL_S"] for _, limit in self.steps)
                + self.env["SUMMARY_S"])


# -- what a call carries --------------------------------------------------------------------------------

def repo_bytes() -> int:
    """The working tree that travels: tracked and untracked-not-ignored files."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    return sum((ROOT / n).stat().st_size for n in names if n and (ROOT / n).is_file())


def path_bytes(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def expand(item: Carried) -> list[Path]:
    return sorted(Path(p) for p in glob.glob(str(ROOT / item.path)))


def carried(item: Carried) -> tuple[float, list[str], bool]:
    """(MiB, literal paths, here?) of a carried item: what is here, else its cap."""
    paths = [p for p in expand(item) if not p.is_dir() or any(p.iterdir())]
    if not paths:
        return item.cap_mib, [item.path], False
    return sum(path_bytes(p) for p in paths) / MiB, [str(p.relative_to(ROOT)) for p in paths], True


# -- the rules ------------------------------------------------------------------------------------------

@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    failed: int = 0
    rows: list[str] = field(default_factory=list)  # one markdown row per call

    def rule(self, ok: bool, text: str) -> None:
        self.lines.append(f"  {'ok  ' if ok else 'FAIL'} {text}")
        self.failed += not ok


def check_call(call: Call, repo_mib: float, strict: bool, report: Report) -> None:
    script = Script.read(call.script, call.args)
    failed_before = report.failed
    report.lines.append(f"\n{call.name}: {call.command}   ({call.does})")
    sizes = []
    for item in call.carry:
        mib, paths, here = carried(item)
        sizes.append(mib)
        where = ", ".join(paths) if here else f"{item.path}: not here, counted at its cap"
        report.rule(here or not strict, f"carries {mib:6.2f} MiB  {where}  ({item.what})")
    total = repo_mib + sum(sizes)
    report.rule(total <= CARRY_MIB, f"payload {total:.2f} MiB with the repository ({repo_mib:.2f} MiB) "
                                    f"<= {CARRY_MIB} MiB")
    report.rule(len(call.carry) <= 8 and all(len(c.path) <= 200 for c in call.carry),
                f"{len(call.carry)} carried paths <= 8")
    report.rule(script.sources_env, f"{call.script} sources gpu_env.sh (install, budget, pack at exit)")
    report.rule(call.timeout_s <= TIMEOUT_MAX_S, f"timeout_s {call.timeout_s} <= {TIMEOUT_MAX_S}")
    report.rule(script.budget_s + MARGIN_S <= call.timeout_s,
                f"budget {script.budget_s} s ends >= {MARGIN_S} s before timeout_s {call.timeout_s}")
    steps = " + ".join(f"{n} {s}" for n, s in script.steps)
    report.rule(script.needed_s <= script.budget_s,
                f"install {script.env['INSTALL_S']} + steps ({steps}) + {script.env['KILL_S']} s grace each "
                f"+ summary {script.env['SUMMARY_S']} = {script.needed_s} s <= budget {script.budget_s} s")
    back = ["summary.md", "steps.tsv", "rest.tar.gz"] + script.keep
    report.rule(len(set(back)) <= FILES_BACK and all(NAME_OK.match(n) for n in back),
                f"returns {len(set(back))} files <= {FILES_BACK}: {call.out}/{{{','.join(back)}}}")
    depth = call.out.count("/") + 1
    report.rule(depth <= DEPTH_BACK and all(NAME_OK.match(p) for p in call.out.split("/")),
                f"files {depth} folder(s) down in $OUT <= {DEPTH_BACK}")
    failed = report.failed - failed_before
    report.rows.append(f"| {call.name} | {total:.2f}{'' if all(carried(i)[2] for i in call.carry) else ' (caps)'} | "
                       f"{call.timeout_s} | {script.budget_s} (steps need {script.needed_s}) | {len(set(back))}, "
                       f"{depth} folder down | {'all rules met' if not failed else f'{failed} rule(s) not met'} |")


def check_session(name: str, calls: tuple[str, ...], report: Report) -> None:
    total = START_S + sum(Script.read(CALLS[c].script, CALLS[c].args).budget_s + PER_CALL_S for c in calls)
    report.rule(total <= SESSION_S - MARGIN_S,
                f"session {name}: start {START_S} + " + " + ".join(
                    f"{c} {Script.read(CALLS[c].script, CALLS[c].args).budget_s}" for c in calls)
                + f" + {PER_CALL_S} s a call = {total} s <= {SESSION_S - MARGIN_S} s of device time")
    for i, c in enumerate(calls):
        for need in CALLS[c].needs:
            report.rule(need in calls[:i], f"session {name}: {c} runs after {need}, which lands what it needs")


def check(names: list[str], strict: bool) -> Report:
    report = Report()
    repo_mib = repo_bytes() / MiB
    for name in names:
        check_call(CALLS[name], repo_mib, strict, report)
    if len(names) == len(CALLS):
        report.lines.append("\nsessions (calls back to back on one warm machine):")
        for session, calls in SESSIONS.items():
            check_session(session, calls, report)
    return report


def returned(out: Path) -> Report:
    """The rules on what a call left under $OUT (the lending tool's: count, depth, names, sizes)."""
    report = Report()
    files = sorted(p for p in out.rglob("*") if p.is_file() or p.is_symlink())
    report.lines.append(f"{out}: {len(files)} files")
    report.rule(len(files) <= FILES_BACK, f"{len(files)} files <= {FILES_BACK}")
    for p in files:
        rel = p.relative_to(out)
        size = p.stat().st_size / MiB if p.is_file() else 0
        report.rule(len(rel.parts) - 1 <= DEPTH_BACK and all(NAME_OK.match(x) for x in rel.parts)
                    and size <= FILE_BACK_MIB and not p.is_symlink(),
                    f"{rel} ({size:.2f} MiB, {len(rel.parts) - 1} folder(s) down)")
    total = sum(p.stat().st_size for p in files if p.is_file()) / MiB
    report.rule(total <= TOTAL_BACK_MIB, f"{total:.2f} MiB in all <= {TOTAL_BACK_MIB}")
    return report


def plan() -> str:
    """The plan of calls and sessions as markdown (docs/gpu.md holds this text)."""
    lines = ["| call | command | carries (cap, MiB) | timeout_s | budget s | returns (besides summary.md, "
             "steps.tsv, rest.tar.gz) | needs before it |", "|---|---|---|---:|---:|---|---|"]
    for call in CALLS.values():
        script = Script.read(call.script, call.args)
        carry = ", ".join(f"`{c.path}` ({c.cap_mib:g})" for c in call.carry) or "nothing"
        lines.append(f"| {call.name} | `{call.command}` | {carry} | {call.timeout_s} | {script.budget_s} | "
                     f"{', '.join(script.keep) or '—'} | {', '.join(call.needs) or '—'} |")
    lines += ["", "| session (one warm machine) | calls in order | device time with the start (s) |", "|---|---|---:|"]
    for name, calls in SESSIONS.items():
        total = START_S + sum(Script.read(CALLS[c].script, CALLS[c].args).budget_s + PER_CALL_S for c in calls)
        lines.append(f"| {name} | {' → '.join(calls)} | {total} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="every rule for every call (or one)")
    c.add_argument("--call", choices=sorted(CALLS))
    c.add_argument("--strict", action="store_true", help="every carried file must be here (not its cap)")
    c.add_argument("--markdown", action="store_true", help="also one table row per call")
    sub.add_parser("carry", help="a call's literal carry list").add_argument("name", choices=sorted(CALLS))
    sub.add_parser("returned", help="check what a call left under $OUT").add_argument("out", type=Path)
    sub.add_parser("plan", help="the plan as markdown")
    args = p.parse_args(argv)
    if args.cmd == "plan":
        print(plan())
        return 0
    if args.cmd == "carry":
        print(" ".join(path for item in CALLS[args.name].carry for path in carried(item)[1]))
        return 0
    if args.cmd == "returned":
        if not args.out.is_dir():
            print(f"error: OUT: {args.out} is not a folder", file=sys.stderr)
            return 2
        report = returned(args.out)
    else:
        report = check([args.call] if args.call else list(CALLS), args.strict)
    print("\n".join(report.lines))
    if args.cmd == "check" and args.markdown:
        print("\n| call | carries MiB, repository included | timeout_s | budget s | files back (at most) | rules |\n"
              "|---|---:|---:|---|---|---|\n" + "\n".join(report.rows))
    print(f"\n{'all rules met' if not report.failed else f'{report.failed} rule(s) not met'}")
    return 1 if report.failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())
