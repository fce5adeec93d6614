"""A rehearsal of the device calls on CPU, in a Python 3.12 environment like the lent machine's
(torch 2.11 and the machine's own packages, nothing else: scripts/gpu/device_packages.txt):

1. every carried wheel set installs with `pip install --no-index` (gpu_env.sh's command), and
   every requirement of every installed distribution is met by the set, the other sets or the
   environment's own packages;
2. `longctx train` runs 2 steps with ZeRO-2 on CPU over the installed trainer set;
3. each session of scripts/gpu/gpu_calls.py runs on a fresh "machine" folder: each call's payload
   (the repository's files and its carried paths, as the lending tool sends them) is copied over
   the folder, its command runs with OUT set, under its timeout_s, without CUDA; the call must
   end by itself within its budget, print its summary table (every CUDA step reported skipped)
   and leave what comes back within the rules.

    python scripts/gpu/gpu_rehearse.py --python VENV/bin/python --work DIR [--session NAME ...] \\
        [--log FILE]

VENV is made by the caller (docs/results/2026-12-06-gpu-rehearsal.md has the commands). The log
is markdown; the exit code is 1 when a check fails.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_calls  # noqa: E402  (this folder)

ROOT = gpu_calls.ROOT

REQUIREMENTS_CHECK = r"""
import sys
from importlib import metadata
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
# the environment's own packages and every installed set, as PYTHONPATH puts them
dists = {canonicalize_name(d.metadata["Name"]): d for d in metadata.distributions()}
replaced = {"nvidia-cutlass-dsl-libs-cu12": "nvidia-cutlass-dsl-libs-cu13 (the pieces) stands for it with CUDA 13"}
unmet = []
for target in sys.argv[1:]:
    for d in metadata.distributions(path=[target]):
        for text in d.requires or []:
            req = Requirement(text)
            if req.marker and not req.marker.evaluate({"extra": ""}):
                continue
            name = canonicalize_name(req.name)
            if name in replaced:
                print(f"  {d.metadata['Name']} needs {req}: {replaced[name]}")
                continue
            have = dists.get(name)
            if have is None or (req.specifier and not req.specifier.contains(have.version, prereleases=True)):
                unmet.append(f"{d.metadata['Name']} needs {req}: {'missing' if have is None else have.version}")
print(f"  {len(dists)} distributions in all; unmet requirements: {len(unmet)}")
for u in unmet:
    print("  UNMET", u)
sys.exit(1 if unmet else 0)
"""


class Log:
    def __init__(self, path: Path | None):
        self.path, self.lines, self.failed = path, [], 0

    def __call__(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)
        if self.path:
            self.path.write_text("\n".join(self.lines) + "\n")

    def check(self, ok: bool, text: str) -> None:
        self(f"- {'ok' if ok else 'FAIL'}: {text}")
        self.failed += not ok


def run(cmd, log: Log, timeout: int, env=None, cwd=ROOT, tail: int = 0) -> tuple[int, float, str]:
    t0 = time.monotonic()
    try:
        res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                             shell=isinstance(cmd, str), executable="/bin/bash" if isinstance(cmd, str) else None)
        rc, out = res.returncode, res.stdout + res.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = 124, (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    took = time.monotonic() - t0
    if tail:
        log("```")
        for line in out.rstrip().splitlines()[-tail:]:
            log(line)
        log("```")
    return rc, took, out


def payload(call: gpu_calls.Call) -> list[tuple[Path, str]]:
    """(source, path in the repository) of every file the lending tool would send for `call`."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    files = [(ROOT / n, n) for n in names if n and (ROOT / n).is_file()]
    for item in call.carry:
        for p in gpu_calls.expand(item):
            if p.is_dir():
                files += [(f, str(f.relative_to(ROOT))) for f in sorted(p.rglob("*")) if f.is_file()]
            else:
                files.append((p, str(p.relative_to(ROOT))))
    return files


def land(files: list[tuple[Path, str]], machine: Path) -> float:
    """Copy a call's payload over the machine's repository (what was there stays); returns MiB."""
    total = 0
    for src, rel in files:
        dst = machine / "repo" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        total += src.stat().st_size
    return total / gpu_calls.MiB


def wheels(python: str, work: Path, log: Log) -> Path:
    log("## 1. The carried wheels install with `pip install --no-index`\n")
    site = work / "site-check"
    shutil.rmtree(site, ignore_errors=True)
    for wheel_set in sorted(p for p in (ROOT / ".whl").iterdir() if p.is_dir() and p.name != "parts"):
        whls = sorted(wheel_set.glob("*.whl"))
        rc, took, out = run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                             "--no-cache-dir", "--upgrade", "--target", str(site / wheel_set.name), *map(str, whls)],
                            log, 600)
        log.check(rc == 0, f"`.whl/{wheel_set.name}`: {len(whls)} wheels installed in {took:.0f} s"
                  + ("" if rc == 0 else f": {out.strip().splitlines()[-1:]}"))
    for manifest in sorted((ROOT / ".whl" / "parts").glob("*.parts")):
        lines = manifest.read_text().splitlines()
        pieces = [line.split()[1] for line in lines[1:-1]]
        target = site / lines[0]
        cmd = (f"cd {ROOT / '.whl/parts'} && sed '1d;$d' {manifest.name} | sha256sum -c --quiet - && "
               f"cat {' '.join(pieces)} | tar -C {target} -xJf -")
        rc, took, out = run(cmd, log, 600)
        log.check(rc == 0, f"`{manifest.name}`: {len(pieces)} pieces checked, joined and unpacked in {took:.0f} s")
    targets = [str(p) for p in sorted(site.iterdir())]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(targets)}
    log("\nEvery requirement of every installed distribution, against the sets and the environment:\n")
    rc, _, out = run([python, "-c", REQUIREMENTS_CHECK, *targets], log, 300, env=env)
    log("```\n" + out.rstrip() + "\n```")
    log.check(rc == 0, "every requirement met")
    dsl = [f"{site}/fa4/nvidia_cutlass_dsl/{p}" for p in ("python_packages", "dsl_packages")]  # as gpu_env.sh
    rc, took, out = run([python, "-c", "import flash_attn.cute.interface as i, importlib.metadata as m; "
                         "print('flash-attn-4', m.version('flash-attn-4'), 'imports;', '_flash_attn_fwd' in dir(i))"],
                        log, 600, env={**env, "PYTHONPATH": os.pathsep.join(targets + dsl)})
    log.check(rc == 0, f"FlashAttention-4 imports over the joined pieces ({took:.0f} s here): "
                       + (out.strip().splitlines() or ["no output"])[-1])
    return site


def train(python: str, site: Path, work: Path, log: Log) -> None:
    log("\n## 2. `longctx train`: 2 steps, ZeRO-2, on CPU, over the carried trainer set\n")
    out = work / "train-zero2"
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site / "trainer")]), "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": ""}
    cmd = [python, "-m", "longctx", "train", f"out_dir={out}", "model.preset=debug-tiny", "train.steps=2",
           "data.seq_len=256", "data.micro_batch_size=2", "parallel.zero_stage=2", "log.progress=false",
           "log.tensorboard=false", "checkpoint.save_hf=false", "checkpoint.export_hf=false"]
    log(f"`PYTHONPATH=REPO:SITE/trainer {' '.join(cmd[1:])}`\n")
    rc, took, output = run(cmd, log, 900, env=env, tail=6)
    metrics = (out / "metrics.jsonl").read_text().splitlines() if (out / "metrics.jsonl").is_file() else []
    log.check(rc == 0 and len(metrics) == 2, f"rc {rc}, {len(metrics)} steps logged, {took:.0f} s")
    rc, _, mods = run([python, "-c", "import sys, longctx.train.stages, longctx.commands.cli; "
                       "print('datasets' in sys.modules, 'deepspeed' in sys.modules)"], log, 300, env=env)
    log.check(mods.strip().startswith("False"), f"the trainer's modules import without 🤗 datasets ({mods.strip()})")


def session(python: str, name: str, work: Path, log: Log) -> None:
    calls = gpu_calls.SESSIONS[name]
    log(f"\n### session `{name}`: {' → '.join(calls)}\n")
    machine = work / f"machine-{name}"
    shutil.rmtree(machine, ignore_errors=True)
    (machine / "repo").mkdir(parents=True)
    for call_name in calls:
        call = gpu_calls.CALLS[call_name]
        script = gpu_calls.Script.read(call.script, call.args)
        mib = land(payload(call), machine)
        out = machine / "OUT"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        env = {**os.environ, "OUT": str(out), "PYTHON": python, "SITE": str(machine / "site"),
               "CUDA_VISIBLE_DEVICES": "", "PATH": f"{Path(python).parent}:{os.environ['PATH']}"}
        log(f"`{call.command}` (payload {mib:.2f} MiB, timeout_s {call.timeout_s}, budget {script.budget_s} s)\n")
        rc, took, output = run(call.command, log, call.timeout_s, env=env, cwd=machine / "repo", tail=0)
        table = output[output.find("== summary"):] if "== summary" in output else output[-3000:]
        log("```\n" + table.rstrip() + "\n```")
        log.check(mib <= gpu_calls.CARRY_MIB, f"{call.name}: carried {mib:.2f} MiB <= {gpu_calls.CARRY_MIB}")
        log.check(rc != 124 and took <= script.budget_s,
                  f"{call.name}: ended by itself (rc {rc}) after {took:.0f} s <= its budget {script.budget_s} s")
        log.check("== summary" in output and "| step |" in output, f"{call.name}: printed its summary table")
        steps = [line.split("\t") for line in (out / call.out / "steps.tsv").read_text().splitlines()] \
            if (out / call.out / "steps.tsv").is_file() else []
        cuda = [s for s in steps if s[3].startswith("skipped: no CUDA")]
        failed = [s[0] for s in steps if s[3].startswith("rc ") and s[3] != "rc 0" and "stopped at" not in s[3]]
        log.check(not failed, f"{call.name}: the steps that run without CUDA succeed"
                              + (f"; failed: {', '.join(failed)} (see rest.tar.gz)" if failed else ""))
        stopped = [s[0] for s in steps if "skipped: budget spent" in s[3] or "stopped at" in s[3]]
        log.check(not stopped, f"{call.name}: {len(steps)} steps, {len(cuda)} CUDA steps reported skipped, "
                               f"{'none' if not stopped else ', '.join(stopped)} cut by a limit")
        machine_log = out / call.out / "machine.log"
        if machine_log.is_file():
            log("\n`machine.log`:\n```\n" + machine_log.read_text().rstrip() + "\n```")
        returned = gpu_calls.returned(out)
        log.check(returned.failed == 0, f"{call.name}: what comes back: " + "; ".join(
            line.strip() for line in returned.lines[1:] if "FAIL" in line or "files <=" in line)
            + f" ({', '.join(sorted(str(p.relative_to(out)) for p in out.rglob('*') if p.is_file()))})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", required=True, help="the device-like environment's python (3.12, torch 2.11)")
    p.add_argument("--work", type=Path, required=True, help="a scratch folder (machines, installs)")
    p.add_argument("--session", action="append", choices=sorted(gpu_calls.SESSIONS), help="default: every one")
    p.add_argument("--log", type=Path, help="also write the markdown log here")
    args = p.parse_args(argv)
    if not Path(args.python).is_file():
        print(f"error: --python: {args.python} is not a file", file=sys.stderr)
        return 2
    if not (ROOT / ".whl").is_dir():
        print("error: .whl: missing; run bash scripts/gpu/gpu_wheels.sh first", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    log = Log(args.log)
    _, _, facts = run([args.python, "-c", "import platform, torch; print('python', platform.python_version(), "
                       "'torch', torch.__version__, 'CUDA available:', torch.cuda.is_available())"], log, 300)
    log(f"# GPU call rehearsal on CPU\n\nenvironment: {facts.strip()}\n")
    site = wheels(args.python, args.work, log)
    train(args.python, site, args.work, log)
    log("\n## 3. Every session's calls, as the device would run them, without CUDA")
    for name in args.session or list(gpu_calls.SESSIONS):
        session(args.python, name, args.work, log)
    log(f"\n{'every check passed' if not log.failed else f'{log.failed} check(s) failed'}")
    return 1 if log.failed else 0


if __name__ == "__main__":
    sys.exit(main())
