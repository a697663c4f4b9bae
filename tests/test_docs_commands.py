"""Every command in README.md and docs/**/*.md runs as written, so the docs cannot go stale.

The fenced shell blocks are read as a shell would (`\\` continuations, comments, `NAME=value` and
`export NAME=value` earlier in the block substituted and word-split, `&&` / `;` / a trailing `&`,
`torchrun ... -m wamkit.cli` and `python -m wamkit.cli` prefixes; in a usage synopsis `[--opt VALUE]`
is exercised without its brackets, `a|b` takes `a` and a one-letter metavariable is 1). Each wamkit command is then exercised as
cheaply as still proves it right, in-process, in a scratch directory holding the repository's
`recipes/` and `datasets/`; the kind each command maps to is in the failure message and in the
listing `pytest -s` prints:

  run      executed for real: data synth, data demo, data doctor on a dataset that is there, --version
  resolve  parsed, then the recipe loaded and validated with its --set overrides and the block's
           exported variables (what `--dry-run` resolves before it builds anything): train, distill,
           data cache-latents, data doctor --recipe on a dataset that only a cluster has
  parse    parsed by wamkit's own parser, and every simulator env it names registered: export, serve,
           eval, sim record, data bundle / validate / stats (they need a trained run, a simulator or
           minutes of CPU; their paths are tested by the tests of each command)
  file     `bash scripts/X.sh`, `python benchmarks/X.py`: the file exists
  import   `python -c "..."`: compiles, and its `from wamkit... import ...` lines import

Everything else (apt-get, pip, curl, #SBATCH, python robot.py of the next block) is not a wamkit
command and is skipped. The whole file runs in seconds: nothing trains, nothing builds a model."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
from pathlib import Path

import pytest

from wamkit.cli import build_parser, main

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
SHELL_FENCES = ("bash", "sh", "shell", "")
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)")
_VAR = re.compile(r"\$\{(\w+)\}|\$(\w+)")
CLUSTER_ENV = {"SLURM_NNODES": "4", "SLURM_JOB_ID": "1234", "HEAD": "node001"}  # what SLURM sets for docs/cluster.md


def shell_blocks() -> list[tuple[str, str]]:
    """(file:line, text) of every fenced shell block that holds a command."""
    blocks = []
    for path in DOCS:
        text = path.read_text()
        for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
            if m.group(1) in SHELL_FENCES and re.search(r"^\s*(wamkit|torchrun|srun|python|bash) ", m.group(2), re.M):
                blocks.append((f"{path.relative_to(REPO)}:{text[:m.start()].count(chr(10)) + 2}", m.group(2)))
    return blocks


def statements(block: str) -> list[tuple[int, str]]:
    """(line offset, statement): continuations joined, a quote left open carried to the next line."""
    out, pending, start = [], "", 0
    for i, line in enumerate(block.splitlines()):
        if not pending:
            start = i
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
        elif pending.count("'") % 2:
            pending += " "
        else:
            out.extend((start, part) for part in _split_list(pending) if part.strip())
            pending = ""
    return out


def _split_list(line: str) -> list[str]:
    """A shell list split at `&&` and `;` outside quotes."""
    parts, current, quote, i = [], "", None, 0
    while i < len(line):
        ch = line[i]
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == ";" or line.startswith("&&", i):
            parts.append(current)
            current, i = "", i + (2 if ch == "&" else 1)
            continue
        current += ch
        i += 1
    return parts + [current]


def substitute(text: str, env: dict[str, str]) -> str:
    return _VAR.sub(lambda m: env.get(m.group(1) or m.group(2), f"/placeholder/{m.group(1) or m.group(2)}"), text)


def synopsis(tokens: list[str]) -> list[str]:
    """A usage line as one concrete command: brackets dropped, the first of `a|b`."""
    out, group = [], False
    for tok in tokens:
        if tok.startswith("[-"):  # an optional group opens; a TOML list value ([1]) is left alone
            tok, group = tok[1:], True
        if group and tok.endswith("]"):
            tok, group = tok[:-1], False
        if re.fullmatch(r"[A-Z]", tok):  # a number's metavariable: --horizon H
            tok = "1"
        if group or "|" in tok and re.fullmatch(r"[\w-]+(\|[\w-]+)+", tok):
            tok = tok.split("|")[0]
        if tok:
            out.append(tok)
    return out


def wamkit_argv(tokens: list[str]) -> list[str] | None:
    if tokens[:1] == ["wamkit"]:
        return tokens[1:]
    if "wamkit.cli" in tokens and tokens[tokens.index("wamkit.cli") - 1] == "-m":
        return tokens[tokens.index("wamkit.cli") + 1:]
    return None


def exercise(argv: list[str], env: dict[str, str], monkeypatch) -> str:
    """Exercise one wamkit command (module docstring); returns its kind, raises on a stale command."""
    if argv[:1] in (["--version"], ["--help"]):
        with pytest.raises(SystemExit) as info, contextlib.redirect_stdout(io.StringIO()):
            main(argv)
        assert info.value.code == 0
        return "run"
    args = _parse(argv)
    for name, value in env.items():
        if name not in CLUSTER_ENV:
            monkeypatch.setenv(name, value)
    if args.command == "train" or (args.command == "data" and args.data_command == "cache-latents"):
        _resolve(args.recipe, args.overrides)
        return "resolve"
    if args.command == "distill":
        from wamkit.distill import load_distill_recipe

        assert Path(args.recipe).is_file(), f"{args.recipe} does not exist"
        load_distill_recipe(args.recipe, args.overrides)
        return "resolve"
    if args.command == "data" and args.data_command in ("synth", "demo"):
        assert main(argv) == 0
        return "run"
    if args.command == "data" and args.data_command == "doctor":
        if not Path(args.path).exists():
            assert args.recipe, f"{args.path} is not there and no recipe to resolve"
            _resolve(args.recipe, [f"data.path={args.path!r}", *args.overrides])
            return "resolve"
        with contextlib.redirect_stdout(io.StringIO()) as out:
            code = main(argv)
        assert code == 0, out.getvalue()
        return "run"
    for name in [getattr(args, "env", None)]:
        if name:
            from wamkit.sim.envs import expand_env_names

            expand_env_names(name)
    return "parse"


def _parse(argv: list[str]):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return build_parser().parse_args(argv)
    except SystemExit:
        raise AssertionError(f"wamkit {' '.join(argv)} does not parse: {err.getvalue().strip()}") from None


def _resolve(recipe: str, overrides: list[str]) -> None:
    from wamkit.config import load_experiment

    assert Path(recipe).is_file(), f"{recipe} does not exist"
    load_experiment(recipe, overrides)


def other_command(tokens: list[str]) -> str | None:
    """The kind of a non-wamkit line worth checking, after checking it; None to skip it."""
    if tokens[0] == "bash" and len(tokens) > 1 and tokens[1].startswith("scripts/"):
        assert (REPO / tokens[1]).is_file(), f"{tokens[1]} does not exist"
        return "file"
    if tokens[0] == "python" and len(tokens) > 1 and tokens[1].startswith(("benchmarks/", "scripts/")):
        assert (REPO / tokens[1]).is_file(), f"{tokens[1]} does not exist"
        return "file"
    if tokens[:2] == ["python", "-c"]:
        code = tokens[2]
        compile(code, "<doc>", "exec")
        for line in code.split(";"):
            if line.strip().startswith("from wamkit"):
                exec(line.strip(), {})
        return "import"
    return None


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    for name in ("recipes", "datasets"):
        (tmp_path / name).symlink_to(REPO / name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WAMKIT_OUTPUT_ROOT", str(tmp_path / "runs"))
    return tmp_path


BLOCKS = shell_blocks()


@pytest.mark.parametrize("where,block", BLOCKS, ids=[w for w, _ in BLOCKS])
def test_documented_commands_run_as_written(where, block, scratch, monkeypatch):
    file, first = where.rsplit(":", 1)
    env: dict[str, str] = dict(CLUSTER_ENV)
    done = []
    for offset, text in statements(block):
        line = f"{file}:{int(first) + offset}"
        text = substitute(text.strip().removesuffix("&").strip(), env)
        tokens = shlex.split(text, comments=True)
        if not tokens:
            continue
        words = tokens[1:] if tokens[0] == "export" else tokens
        assign = _ASSIGN.fullmatch(words[0]) if len(words) == 1 else None
        if assign:
            env[assign.group(1)] = assign.group(2)
            continue
        if tokens[0] == "srun":
            tokens = tokens[1:]
        argv = wamkit_argv(tokens)
        try:
            kind = exercise(synopsis(argv), env, monkeypatch) if argv is not None else other_command(tokens)
        except Exception as exc:
            raise AssertionError(f"{line}: `{text}` is stale: {type(exc).__name__}: {exc}") from exc
        if kind:
            done.append(f"{kind:8s} {line}  {' '.join(tokens)[:100]}")
    assert done, f"{where}: no command recognised"
    print("\n".join(done))


def test_the_docs_hold_the_commands_a_newcomer_runs():
    """The extraction finds the blocks it should: a changed fence or prefix must not skip them silently."""
    text = "\n".join(block for _, block in BLOCKS)
    assert len(BLOCKS) >= 25
    for command in ("wamkit train", "wamkit serve", "wamkit export", "wamkit eval sim", "wamkit eval wm",
                    "wamkit data doctor", "wamkit sim record", "torchrun"):
        assert command in text, command
    readme = next(block for where, block in BLOCKS if where.startswith("README.md") and "data doctor" in block)
    assert "wamkit train" in readme and "wamkit serve" in readme  # the own-dataset section


def test_the_quoting_convention_holds():
    """--set values are bare; TOML quotes only where a string would read as a number or boolean."""
    for where, block in BLOCKS:
        for m in re.finditer(r"--set [\w.]+='\"([^\"]*)\"'", block):
            assert re.fullmatch(r"[\d.eE+-]+|true|false", m.group(1)), f"{where}: write --set ...={m.group(1)} bare"
