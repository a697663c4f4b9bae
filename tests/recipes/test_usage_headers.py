"""The usage comment at the top of every seed recipe runs as written: it names exactly the environment
variables the recipe reads, its commands parse, the full recipes resolve (dry run) with those variables
set, and the tiny twins train from a bare checkout with nothing but the header's lines."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, run_cli
from wamkit.config.loader import read_recipe
from wamkit.config.env import env_references

FULL = ["g1_simple", "droid", "so101_fd_chunk16"] + [f"sim_bimanual_stage{k}" for k in range(4)]
TINY = ["g1_simple", "droid", "so101_fd_chunk16"]
SEED_RECIPES = [f"recipes/{n}.toml" for n in FULL] + [f"recipes/tiny/{n}.toml" for n in TINY]
ENV_NAME = re.compile(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]*\b")  # SIMPLE_ROOT, WAN_VAE_PATH, ...; not DROID or FSDP2
CLI = re.compile(r"^(?:torchrun --nproc-per-node=(\d+) -m wamkit\.cli|wamkit) (.*)$")


def header(recipe: str) -> list[str]:
    """The leading comment block, '#' stripped."""
    lines = []
    for line in (REPO / recipe).read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:])
    return lines


def header_commands(recipe: str) -> list[str]:
    """The header's shell lines: comment lines indented by two or more spaces."""
    return [line.strip() for line in header(recipe) if line.startswith("   ")]


def variables_read(recipe: str) -> set[str]:
    def strings(node):
        if isinstance(node, dict):
            for value in node.values():
                yield from strings(value)
        elif isinstance(node, list):
            for value in node:
                yield from strings(value)
        elif isinstance(node, str):
            yield node

    return {name for text in strings(read_recipe(REPO / recipe)) for name in env_references(text)}


def exports(recipe: str) -> dict[str, str]:
    out = {}
    for line in header_commands(recipe):
        if line.startswith("export "):
            for word in shlex.split(line, comments=True)[1:]:
                name, _, value = word.partition("=")
                out[name] = value
    return out


def cli_commands(recipe: str) -> list[tuple[int, list[str]]]:
    """(GPUs, argv after `wamkit`) of every wamkit command in the header; GPUs 0 for a plain `wamkit`."""
    out = []
    for line in header_commands(recipe):
        match = CLI.match(line)
        if match:
            out.append((int(match.group(1) or 0), shlex.split(match.group(2), comments=True)))
    return out


@pytest.mark.parametrize("recipe", SEED_RECIPES)
def test_header_names_exactly_the_variables_the_recipe_reads(recipe):
    named = set(ENV_NAME.findall("\n".join(header(recipe))))
    assert named == variables_read(recipe), f"{recipe}: header names {sorted(named)}, recipe reads {sorted(variables_read(recipe))}"
    exported = set(exports(recipe))
    assert exported <= named
    # every variable is exported, except a fallback (${A:-$B}) that the header names as the alternative
    assert not exported or exported >= {n for n in named if f"${{{n}" in (REPO / recipe).read_text()}


def test_the_header_check_fails_on_a_stale_header(tmp_path, monkeypatch):
    """The check above is not vacuous: a header that forgot a variable is caught."""
    text = (REPO / "recipes" / "g1_simple.toml").read_text().replace("WAN_VAE_PATH=/path/to/wan22_vae", "VAE=/x", 1)
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "stale.toml").write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    with pytest.raises(AssertionError, match="WAN_VAE_PATH"):
        test_header_names_exactly_the_variables_the_recipe_reads("recipes/stale.toml")


@pytest.mark.parametrize("name", FULL)
def test_full_recipe_header_command_is_the_documented_one_and_targets_the_gpus(name):
    recipe = f"recipes/{name}.toml"
    commands = cli_commands(recipe)
    runs = [(gpus, argv) for gpus, argv in commands if argv[0] in ("train", "distill")]
    assert len(runs) == 1, commands
    gpus, argv = runs[0]
    assert gpus >= 1 and argv[1] == recipe
    assert "--device" not in argv  # the default (auto) puts each rank on its GPU; the header needs no flag
    assert ("distill" in read_recipe(REPO / recipe)) == (argv[0] == "distill")
    doc = (REPO / "docs" / "recipes" / (name.split("_stage")[0] + ".md")).read_text()
    torchrun = next(line for line in header_commands(recipe) if line.startswith("torchrun"))
    assert torchrun in doc, f"docs do not show {recipe}'s command: {torchrun}"


def _fixture_env(recipe: str, tmp_path: Path) -> dict[str, str]:
    """The header's variables set to a synthetic dataset / bundle of the recipe's schema, an empty base
    checkpoint (random init) and a placeholder VAE directory (a dry run checks its files, not their contents)."""
    from wamkit.bimanual import write_synthetic_bundle
    from wamkit.sim.schema_synth import write_schema_dataset

    env = {}
    for var in variables_read(recipe):
        if var in ("SIMPLE_ROOT", "DATASET_PATH"):
            schema = {"g1_simple": "g1_simple", "droid": "droid", "so101_fd_chunk16": "so101"}[Path(recipe).stem]
            root = tmp_path / schema
            env[var] = str(root if root.exists() else write_schema_dataset(schema, root, episodes=2))
        elif var == "BIMANUAL_BUNDLE":
            env[var] = str(write_synthetic_bundle(tmp_path / "bundle", samples=4, chunk_length=32))
        elif var in ("BASE_CHECKPOINT_PATH", "COSMOS3_NANO_DIR"):
            env[var] = ""
        elif var.endswith("VAE_PATH"):  # the files a dry run looks for; it does not load them
            vae = tmp_path / "vae"
            vae.mkdir(exist_ok=True)
            (vae / "config.json").write_text('{"_class_name": "AutoencoderKLWan"}')
            (vae / "diffusion_pytorch_model.safetensors").touch()
            env[var] = str(vae)
        else:  # a previous stage's iteration directory
            env[var] = exports(recipe)[var]
    return env


@pytest.mark.parametrize("name", FULL)
def test_full_recipe_header_runs_as_written_up_to_the_dry_run(name, tmp_path):
    """Each header command with the variables set; train / distill with --dry-run (Nano on a CPU)."""
    recipe = f"recipes/{name}.toml"
    env = _fixture_env(recipe, tmp_path)
    for var in variables_read(recipe) - set(env):
        env[var] = exports(recipe)[var]
    assert set(env) == variables_read(recipe)
    ran = 0
    for _, argv in cli_commands(recipe):
        if argv[0] == "eval":
            continue  # needs a trained run
        argv = [re.sub(r"\$\{?(\w+)\}?", lambda m: env[m.group(1)], a) for a in argv]  # the shell's expansion
        if argv[0] in ("train", "distill"):
            argv = argv + ["--dry-run"]
        dry_run = argv[0] in ("train", "distill")
        proc = run_cli(argv, env=env, check=not dry_run)
        ran += 1
        if dry_run:  # the only inputs a dry run may miss: a previous stage's runs, not trained yet
            errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
            assert all(re.match(r"error: (checkpoint\.load_path|distill\.\w+_path): runs/", e) for e in errors), proc.stderr
            assert proc.returncode == (2 if errors else 0), proc.stderr
        if "--dry-run" in argv:
            assert "preset = nano" in proc.stdout and "memory per GPU" in proc.stdout
            assert 'path = "' + env.get("SIMPLE_ROOT", env.get("DATASET_PATH", env.get("BIMANUAL_BUNDLE"))) + '"' in proc.stdout
            if "BASE_CHECKPOINT_PATH" in env or "COSMOS3_NANO_DIR" in env:
                assert 'load_path = ""' in proc.stdout  # the empty base variable: random init
    assert ran >= 1


@pytest.mark.parametrize("name", TINY)
def test_tiny_recipe_header_trains_verbatim_from_the_repository_root(name, tmp_path):
    """The header's lines, character for character, in a directory holding only recipes/ (so the data and
    runs they write land there), with no wamkit variable set."""
    recipe = f"recipes/tiny/{name}.toml"
    assert variables_read(recipe) == set()
    (tmp_path / "recipes").symlink_to(REPO / "recipes")
    script = "set -e\n" + "\n".join(header_commands(recipe)) + "\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WAMKIT_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # the venv's `wamkit`
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), str(REPO), env.get("PYTHONPATH", "")]))
    proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "fresh run from random initialisation" in proc.stdout
    job = read_recipe(REPO / recipe)["job"]["name"]
    assert (tmp_path / "runs" / job / "checkpoints" / "latest").exists()
