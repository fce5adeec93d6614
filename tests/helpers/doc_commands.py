"""The shell commands of README.md, docs/*.md and docs/results/*.md as a reader copies them: found in the fenced
```bash blocks, and run the way a reader runs them (a fresh directory, the venv's bin on PATH,
no terminal).

Marking, invisible on a rendered page: an HTML comment `<!-- doc-test: run -->` on the line
before a block runs every command in it (tests/integration/test_doc_commands.py); the commands
of any other block must be listed there as not run, with the reason.

A command is one logical line (`\\` continuations joined, comment lines skipped). A line that
only assigns a variable (`J=RULER/...`, `S=$(mktemp -d)`) is not a command: it is set before
each later command of its block.

Keys: a command is named by its text alone (`DocCommand.key`: one line, comments and repeated
blanks removed), never by its file or line, so editing the prose around a command, moving it
within a doc or to another doc, or re-wrapping its continuation lines changes nothing; only a
change to the command itself needs its entry (or its run) updated. Test ids use the key too.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN_MARK = "<!-- doc-test: run -->"
SHELL_INFO = ("bash", "sh", "shell")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)")
ASSIGNMENT = re.compile(r"""^(export\s+)?[A-Za-z_]\w*=(\$\([^()]*\)|"[^"]*"|'[^']*'|[^\s;&|'"])*\s*(#.*)?$""")
# an unlabeled block that starts like this is a command a reader would copy: it needs ```bash
COMMAND_WORDS = re.compile(r"^((longctx|python3?|torchrun|sbatch|pip|accelerate|deepspeed|bash|kill|"
                           r"huggingface-cli|hf)\s"
                           r"|\.venv/bin/\S+\s|\./run\.sh|launch/\S+\.(sh|py)|slurm/\S+\.sbatch|\S+/\S+\.py\s)")
# paths that exist only in a checkout: a command using one runs from (a view of) the checkout
CHECKOUT_PATHS = re.compile(r"(^|[\s=:])(\./|\$PWD|configs/|launch/|slurm/|tests/|benchmarks/|scripts/|"
                            r"docs/|\.venv/|run\.sh)")
# what a command may write in the checkout view: never linked to the real checkout
OUTPUTS = {"runs", "logs", "eval", "hf", "eval_out"}


@dataclass(frozen=True)
class DocCommand:
    doc: str  # path relative to the checkout
    line: int  # 1-based line of its first line
    text: str  # as written (continuation lines joined with their backslashes and newlines)
    setup: tuple[str, ...]  # the block's assignment lines before it
    marked: bool  # its block carries RUN_MARK

    @property
    def key(self) -> str:
        """One line, comments and repeated blanks removed: how test files name the command."""
        joined = " ".join(strip_comment(part).rstrip("\\").strip() for part in self.text.splitlines())
        return " ".join(joined.split())

    @property
    def where(self) -> str:
        """Where it is now (for messages only: it moves when prose around it changes)."""
        return f"{self.doc}:{self.line}"

    @property
    def test_id(self) -> str:
        """A pytest id that survives prose edits: the doc and the command's key."""
        return f"{self.doc}::{self.key}"

    @property
    def in_checkout(self) -> bool:
        return bool(CHECKOUT_PATHS.search(self.key))


@dataclass(frozen=True)
class Block:
    doc: str
    line: int  # line of the opening fence
    info: str  # the first word of the info string ('' when none)
    lines: tuple[str, ...]
    marked: bool


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md, the manuals (docs/*.md) and the dated reports (docs/results/*.md)."""
    docs = root / "docs"
    return [root / "README.md", *sorted(docs.glob("*.md")), *sorted((docs / "results").glob("*.md"))]


def strip_comment(line: str) -> str:
    """The line without a trailing `# comment` (a # that starts a word outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line


def blocks(path: Path, root: Path = ROOT) -> list[Block]:
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.groups()
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        marked = i > 0 and lines[i - 1].strip() == RUN_MARK
        body = tuple(line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[i + 1:j])
        found.append(Block(str(path.relative_to(root)), i + 1, info.lower(), body, marked))
        i = j + 1
    return found


def commands(block: Block) -> list[DocCommand]:
    out, setup, i = [], [], 0
    while i < len(block.lines):
        start, parts = i, [block.lines[i]]
        while parts[-1].rstrip().endswith("\\") and i + 1 < len(block.lines):
            i += 1
            parts.append(block.lines[i])
        i += 1
        text = "\n".join(parts)
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        if len(parts) == 1 and ASSIGNMENT.match(text.strip()):
            setup.append(text.strip())
            continue
        out.append(DocCommand(block.doc, block.line + 1 + start, text, tuple(setup), block.marked))
    return out


def all_blocks(root: Path = ROOT) -> list[Block]:
    return [b for path in doc_files(root) for b in blocks(path, root)]


def shell_commands(root: Path = ROOT) -> list[DocCommand]:
    return [c for b in all_blocks(root) if b.info in SHELL_INFO for c in commands(b)]


def unlabeled_command_blocks(root: Path = ROOT) -> list[Block]:
    """Blocks without an info string whose first line reads like a command (they need ```bash)."""
    out = []
    for b in all_blocks(root):
        first = next((line.strip() for line in b.lines if line.strip()), "")
        if b.info == "" and COMMAND_WORDS.match(first):
            out.append(b)
    return out


def marks_not_on_shell_blocks(root: Path = ROOT) -> list[Block]:
    return [b for b in all_blocks(root) if b.marked and b.info not in SHELL_INFO]


# ------------------------------------------------------------------------------ running
def checkout_view(dest: Path, root: Path = ROOT) -> Path:
    """A directory that looks like the checkout (a link per top-level entry, the venv included)
    but keeps what a command writes (runs/, logs/, SLURM .out files) to itself."""
    dest.mkdir(parents=True, exist_ok=True)
    for entry in root.iterdir():
        hidden = entry.name.startswith(".") and entry.name not in (".venv", ".ci")
        if hidden or entry.name in OUTPUTS or entry.name.endswith(".out"):
            continue
        (dest / entry.name).symlink_to(entry)
    return dest


def reader_env(venv_bin: Path, tmp: Path) -> dict:
    """A reader's shell: the venv's bin first on PATH, no launcher or SLURM variables, a TMPDIR
    of the test's own (mktemp in a command lands there)."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "LONGCTX_PYTHON", "SLURM_STUB_STATE", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("SLURM_")}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p) != venv_bin]
    env["PATH"] = os.pathsep.join([str(venv_bin), *path])
    env["VIRTUAL_ENV"] = str(venv_bin.parent)
    (tmp / "tmp").mkdir(parents=True, exist_ok=True)
    env["TMPDIR"] = str(tmp / "tmp")
    return env


def workdir(cmd: DocCommand, tmp: Path) -> Path:
    """Where a reader runs the command: a view of the checkout when it names a checkout path
    (configs/, launch/, $PWD, ...), an empty directory otherwise."""
    if cmd.in_checkout:
        return checkout_view(tmp / "checkout")
    (tmp / "empty").mkdir(parents=True, exist_ok=True)
    return tmp / "empty"


def run_command(cmd: DocCommand, cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """bash runs the block's assignments, then the command as written; no terminal."""
    script = "\n".join([*cmd.setup, cmd.text])
    return subprocess.run(["bash", "--noprofile", "--norc", "-c", script], cwd=cwd, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------------------ SLURM stub jobs
LAUNCHED = "[torchrun.sh on"  # launch/torchrun.sh's first line: the batch script got past preflight and srun


def stub_jobs(tmp: Path) -> list[tuple[Path, str]]:
    """(state dir, job id) of every job the SLURM stubs started with a state dir in the command's
    TMPDIR (`S=$(mktemp -d)`)."""
    return [(spool.parent, spool.stem[len("job"):]) for state in (tmp / "tmp").rglob("next_id")
            for spool in sorted(state.parent.glob("job*.sh"))]  # sbatch writes the spool copy before it returns


def settle_stub_job(state: Path, job: str, submit_dir: Path, timeout: float) -> tuple[str, str]:
    """Waits until the job ends or reaches launch/torchrun.sh, then stops it (its whole process
    group: batch shell, srun, torchrun, workers). Returns (outcome, its log): 'launched', or
    'exit N' when it ended first."""
    deadline = time.time() + timeout
    log_text, outcome = "", "timeout"
    while time.time() < deadline:
        logs = sorted(submit_dir.glob(f"*-{job}.out"))  # #SBATCH --output=%x-%j.out
        log_text = logs[0].read_text(errors="replace") if logs else ""
        done = state / f"{job}.done"
        if done.exists():
            outcome = f"exit {done.read_text().split()[0]}"
            break
        if LAUNCHED in log_text:
            outcome = "launched"
            break
        time.sleep(0.5)
    stop_stub_job(state, job)
    return outcome, log_text


def stop_stub_job(state: Path, job: str) -> None:
    try:
        pgid = os.getpgid(int((state / f"{job}.pid").read_text()))
    except (OSError, ValueError):
        return  # already gone
    if pgid != os.getpgid(0):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ------------------------------------------------------------------------------ commands not run
LONGCTX_COMMANDS = ("train", "eval", "export", "plan", "demo")
REPO_PATH = re.compile(r"^(\./)?(configs|launch|slurm|benchmarks|tests|scripts|docs)/[^\s$*{}\[\]]+$|^\./run\.sh$")


@dataclass(frozen=True)
class Interface:
    """What a command that is not run still promises: each program's --help lists the options the
    command gives it, and the checkout files it names exist."""
    checks: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]  # (help argv, --options given to it)
    paths: tuple[str, ...]  # checkout paths it names (configs/..., benchmarks/..., ...)


def words(key: str) -> list[str]:
    """Whitespace words with the quotes and [optional] brackets a reader does not type removed."""
    return [w.strip("[]'\"") for w in key.split()]


def _options(ws: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(w.split("=")[0] for w in ws if w.startswith("--") and w != "--"))


def interface(key: str, python: str, root: Path = ROOT) -> Interface:
    """Programs whose options are checked: `longctx SUB` (also after torchrun's `-m`, accelerate's
    `-m`, deepspeed's `--module`), `python benchmarks/X.py` and `launch/torchrun.sh` (before `--`)."""
    ws = words(key)
    paths = tuple(p for w in ws for p in [w, w.partition("=")[2]] if REPO_PATH.match(p))
    checks = []
    for i, w in enumerate(ws):
        if w == "longctx" and i + 1 < len(ws) and ws[i + 1] in LONGCTX_COMMANDS:
            checks.append(((str(Path(python).parent / "longctx"), ws[i + 1], "--help"), _options(ws[i + 2:])))
            break
        if w.startswith("benchmarks/") and w.endswith(".py") and i > 0 and "python" in ws[i - 1]:
            checks.append(((python, str(root / w), "--help"), _options(ws[i + 1:])))
            break
        if w == "launch/torchrun.sh":
            end = ws.index("--", i) if "--" in ws[i:] else len(ws)
            checks.append(((str(root / w), "--help"), _options(ws[i + 1:end])))
            if end + 1 < len(ws) and ws[end + 1] in LONGCTX_COMMANDS:  # -- train ...: a longctx command line
                checks.append(((str(Path(python).parent / "longctx"), ws[end + 1], "--help"), _options(ws[end + 2:])))
            break
    return Interface(tuple(checks), paths)
