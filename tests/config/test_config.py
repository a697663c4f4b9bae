import pytest

from tests.helpers import DEMO_RECIPE, REPO, run_cli
from wamkit.config import load_experiment
from wamkit.errors import ConfigError


def test_overrides_are_typed_and_applied_in_order():
    cfg = load_experiment(DEMO_RECIPE, ["trainer.max_iter=7", "scheduler.warm_up_steps=[3]", "trainer.max_iter=9", "job.name=abc"])
    assert cfg.trainer.max_iter == 9
    assert cfg.scheduler.warm_up_steps == [3]
    assert cfg.job.name == "abc"


def test_unknown_key_names_the_nearest_valid_key():
    with pytest.raises(ConfigError) as err:
        load_experiment(DEMO_RECIPE, ["trainer.max_iters=5"])
    assert "trainer.max_iters" in str(err.value) and "did you mean trainer.max_iter" in str(err.value)


def test_unknown_key_in_recipe_file_is_rejected(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('[optimizer]\nlearning_rate = 0.1\n[data]\npath = "x"\n')
    with pytest.raises(ConfigError, match="optimizer.learning_rate.*unknown key"):
        load_experiment(recipe)


def test_wrong_type_and_bad_values_are_rejected():
    with pytest.raises(ConfigError, match="expected an integer"):
        load_experiment(DEMO_RECIPE, ["trainer.max_iter=many"])
    with pytest.raises(ConfigError, match="multiple of 4"):
        load_experiment(DEMO_RECIPE, ["data.chunk_length=10"])
    with pytest.raises(ConfigError, match="data.normalization"):
        load_experiment(DEMO_RECIPE, ["data.normalization=zscore"])


def test_cli_reports_config_errors_without_traceback():
    proc = run_cli(["train", str(DEMO_RECIPE), "--set", "model.presett=tiny", "--dry-run"], check=False)
    assert proc.returncode == 2
    assert "did you mean model.preset" in proc.stderr and "Traceback" not in proc.stderr


def test_dry_run_prints_resolved_config_and_token_counts(demo_root):
    proc = run_cli(["train", str(DEMO_RECIPE), "--dry-run", "--set", f'data.path="{demo_root}"'])
    assert "[trainer]" in proc.stdout and f"max_iter = {load_experiment(DEMO_RECIPE).trainer.max_iter}" in proc.stdout
    assert "video 48 (3 latent frames x 16 patches) + action 9 (8 actions + 1 state row)" in proc.stdout
    assert "parameters: total" in proc.stdout


def test_dry_run_of_nano_preset_counts_real_parameters_without_memory(demo_root):
    proc = run_cli(["train", str(DEMO_RECIPE), "--dry-run", "--set", f'data.path="{demo_root}"', "--set", "model.preset=nano", "--set", "model.max_action_dim=36"])
    line = next(l for l in proc.stdout.splitlines() if l.startswith("parameters:"))
    total = int(line.split("total ")[1].split()[0].replace(",", ""))
    assert 15.0e9 < total < 15.6e9  # Cosmos3-Nano: 15.2 B with both pathways


def test_recipe_extends_overlays_a_parent(tmp_path):
    (tmp_path / "full.toml").write_text('[data]\npath = "x"\nchunk_length = 32\nfps = 50.0\n[trainer]\nmax_iter = 9000\n')
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "t.toml").write_text('extends = "../full.toml"\n[trainer]\nmax_iter = 5\n')
    cfg = load_experiment(tmp_path / "tiny" / "t.toml")
    assert cfg.trainer.max_iter == 5 and cfg.data.chunk_length == 32 and cfg.data.fps == 50.0
    (tmp_path / "loop.toml").write_text('extends = "loop.toml"\n')
    with pytest.raises(ConfigError, match="cycle"):
        load_experiment(tmp_path / "loop.toml")


def test_unset_environment_variable_in_a_path_is_named():
    import os

    from wamkit.config.env import expand_env

    os.environ.pop("WAMKIT_TEST_UNSET", None)
    with pytest.raises(ConfigError, match="WAMKIT_TEST_UNSET"):
        expand_env("${WAMKIT_TEST_UNSET}/data", "data.path")
    os.environ["WAMKIT_TEST_FALLBACK"] = "/fb"
    assert expand_env("${WAMKIT_TEST_UNSET:-$WAMKIT_TEST_FALLBACK}/d", "data.path") == "/fb/d"


def test_negative_prefetch_is_refused_with_the_field_named():
    proc = run_cli(["train", str(DEMO_RECIPE), "--dry-run", "--set", "parallel.prefetch_layers=-1"], check=False)
    assert proc.returncode != 0 and "parallel.prefetch_layers" in proc.stderr + proc.stdout


def test_demo_smoke_test_trains_with_a_warm_up_as_long_as_the_run(tmp_path):
    """`wamkit train recipes/demo_tiny.toml --set trainer.max_iter=20`, the natural smoke test: the
    recipe's 20-step warm-up (cycle_lengths = [] -> [max_iter]) is shortened with a note, not an error.
    max_iter=3 with warm_up_steps=[5] is the same case, in a few seconds."""
    from tests.helpers import DEMO_RECIPE, run_cli

    args = ["train", str(DEMO_RECIPE), "--set", "trainer.max_iter=3", "--set", "scheduler.warm_up_steps=[5]",
            "--set", f'job.output_root="{tmp_path}"', "--set", "trainer.progress_bar=false"]
    proc = run_cli(args)
    assert "warm-up shortened to 2 steps" in proc.stdout
    assert (tmp_path / "demo_tiny" / "checkpoints" / "iter_000000003").is_dir()  # max_iter < save_iter: saved at the end


def test_warm_up_clamp_keeps_the_schedule_shape_and_explicit_cycles_still_fail():
    from types import SimpleNamespace

    from wamkit.config.schedule import build_schedule

    cfg = SimpleNamespace(kind="LambdaLinear", warm_up_steps=[20], cycle_lengths=[], f_start=[0.0], f_max=[1.0], f_min=[0.0])
    s = build_schedule(cfg, 20)
    assert s.warm_up_steps == [19] and s(0) == 0.0 and s(19) == 1.0
    assert build_schedule(cfg, 400).warm_up_steps == [20]  # fits: untouched
    with pytest.raises(ConfigError, match="scheduler.warm_up_steps") as err:
        load_experiment(DEMO_RECIPE, ["scheduler.cycle_lengths=[20]"])
    assert err.value.fix.startswith("--set scheduler.warm_up_steps=[2]")


def test_every_config_error_of_a_bad_override_carries_a_fix():
    for override in ("trainer.max_iter=0", "trainer.max_iter=1.5", "trainer.progress_bar=1", "optimizer.lr=abc",
                     "job.name=3", "trainer.max_iter.x=1", "scheduler.warm_up_steps=[1,2]", "scheduler.cycle_lengths=[0]"):
        with pytest.raises(ConfigError) as err:
            load_experiment(DEMO_RECIPE, [override])
        assert err.value.fix, override
    with pytest.raises(ConfigError, match=r"^--set trainer.max_iter=1.5: trainer.max_iter"):
        load_experiment(DEMO_RECIPE, ["trainer.max_iter=1.5"])  # names the --set, not the recipe file


@pytest.mark.parametrize("field,needle", [
    ("checkpoint.load_path", "Cosmos3 diffusers dir or reference safetensors"),
    ("model.vae_path", "AutoencoderKLWan"),
    ("data.path", "LeRobot v3.0 dataset root"),
    ("data.keep_ranges_path", "keep-ranges JSON"),
    ("data.latent_cache", "wamkit data cache-latents"),
    ("distill.teacher_path", "iteration directory"),
])
def test_unset_variable_error_names_variable_field_and_a_fix_for_the_field(field, needle, monkeypatch):
    from wamkit.config.env import expand_env

    monkeypatch.delenv("WAMKIT_TEST_UNSET", raising=False)
    with pytest.raises(ConfigError) as err:
        expand_env("${WAMKIT_TEST_UNSET}", field)
    assert err.value.where == field and "WAMKIT_TEST_UNSET" in err.value.problem
    assert err.value.fix.startswith("export WAMKIT_TEST_UNSET=") and needle in err.value.fix
    assert "/path/to/dataset" not in err.value.fix or field == "data.path"


def test_base_checkpoint_variable_unset_is_an_error_with_both_ways_out_and_empty_means_random_init(monkeypatch):
    from wamkit.train.setup import load_base_weights

    recipe = REPO / "recipes" / "g1_simple.toml"
    monkeypatch.delenv("BASE_CHECKPOINT_PATH", raising=False)
    cfg = load_experiment(recipe)  # unset: kept as written (a dry run needs no environment) ...
    assert cfg.checkpoint.load_path == "${BASE_CHECKPOINT_PATH}"
    with pytest.raises(ConfigError) as err:  # ... and the error when the base is loaded
        load_base_weights(None, cfg)
    text = str(err.value)
    assert text.startswith("checkpoint.load_path: uses ${BASE_CHECKPOINT_PATH}, which is not set")
    assert "export BASE_CHECKPOINT_PATH=/path/to/Cosmos3-Nano" in text and "--set checkpoint.load_path=''" in text
    monkeypatch.setenv("BASE_CHECKPOINT_PATH", "")
    assert load_experiment(recipe).checkpoint.load_path == ""  # set but empty: random init
    monkeypatch.setenv("BASE_CHECKPOINT_PATH", "/ckpt/nano")
    assert load_experiment(recipe).checkpoint.load_path == "/ckpt/nano"  # recorded as used


def test_fallback_variables_and_empty_required_paths_name_the_variables(monkeypatch):
    recipe = REPO / "recipes" / "g1_simple.toml"
    for var in ("SIMPLE_ROOT", "DATASET_PATH"):
        monkeypatch.delenv(var, raising=False)
    from wamkit.config.env import expand_env

    with pytest.raises(ConfigError, match="SIMPLE_ROOT is not set and the fallback's DATASET_PATH is not set") as err:
        expand_env("${SIMPLE_ROOT:-$DATASET_PATH}", "data.path")
    assert "export SIMPLE_ROOT=/path/to/dataset (or DATASET_PATH=...)" in err.value.fix
    monkeypatch.setenv("DATASET_PATH", "/data/g1")
    assert load_experiment(recipe).data.path == "/data/g1"
    monkeypatch.setenv("DATASET_PATH", "")
    with pytest.raises(ConfigError, match=r"data.path: is empty \(\$\{SIMPLE_ROOT:-\$DATASET_PATH\}") as err:
        load_experiment(recipe)
    assert err.value.fix.startswith("export SIMPLE_ROOT=")
    monkeypatch.setenv("DATASET_PATH", "/data/g1")
    monkeypatch.setenv("WAN_VAE_PATH", "")
    with pytest.raises(ConfigError, match="model.vae_path") as err:
        load_experiment(recipe)
    assert "WAN_VAE_PATH set but empty" in err.value.problem and "export WAN_VAE_PATH=/path/to/wan22_vae" in err.value.fix


def test_an_object_store_root_is_a_bucket_path_never_a_local_folder_named_like_the_scheme(tmp_path, monkeypatch):
    from wamkit.storage import is_remote

    run = load_experiment(DEMO_RECIPE, ['job.output_root="s3://bucket/runs"']).job.run_dir()
    assert is_remote(run) and str(run) == "s3://bucket/runs/demo_tiny"
    monkeypatch.setenv("WAMKIT_STAGING_DIR", str(tmp_path / "staging"))  # its logs are staged locally, then uploaded
    assert load_experiment(DEMO_RECIPE, ['job.output_root="s3://bucket/runs"']).job.local_dir() == tmp_path / "staging/s3/bucket/runs/demo_tiny"
    monkeypatch.setenv("WAMKIT_OUTPUT_ROOT", "hdfs://nn/runs")  # the environment's default root is checked too
    with pytest.raises(ConfigError, match="WAMKIT_OUTPUT_ROOT.*hdfs://"):
        load_experiment(DEMO_RECIPE).job.run_dir()
    monkeypatch.setenv("WAMKIT_OUTPUT_ROOT", str(tmp_path / "s3:"))  # a local path with a colon stays a path
    assert load_experiment(DEMO_RECIPE).job.run_dir() == tmp_path / "s3:" / "demo_tiny"
    monkeypatch.setenv("BASE_FOR_TEST", "ftp://host/base")  # a URL through a ${VAR} is checked after expansion
    with pytest.raises(ConfigError, match="checkpoint.load_path.*ftp://"):
        load_experiment(DEMO_RECIPE, ['checkpoint.load_path="${BASE_FOR_TEST}"'])


@pytest.mark.parametrize("command", [["export", "hdfs://nn/runs/r", "out"], ["export", "runs/r", "gs://bucket/export"],
                                     ["serve", "ftp://host/export"], ["eval", "sim", "runs/r", "metaworld/reach-v3",
                                                                      "--episodes", "1", "--seed", "1", "--out", "s3://bucket/eval"],
                                     ["eval", "wm", "hdfs://nn/runs/r"]])
def test_commands_refuse_urls_they_cannot_honour_before_any_work(command):
    from tests.helpers import REPO, run_cli

    proc = run_cli(command, check=False)
    assert proc.returncode == 2, proc.stderr
    assert f"wamkit {command[0]}" in proc.stderr and ("does not support" in proc.stderr or "local directory" in proc.stderr)
    assert not any((REPO / name).exists() for name in ("s3:", "gs:", "hdfs:", "ftp:", "out"))


def test_variables_are_expanded_once_at_load_and_read_as_they_are(tmp_path, monkeypatch):
    """A recipe's ${VAR} paths are expanded by load_experiment; building the run's data and tokenizers reads
    the values as they are (no second expansion, whose answer could differ from the one the run recorded),
    and a variable unset at load raises its field's error only where that path is needed."""
    import wamkit.config.env as env
    from wamkit.data import write_demo_dataset
    from wamkit.train.datasets import build_run_data
    from wamkit.train.setup import build_tokenizers

    root = write_demo_dataset(tmp_path / "demo", num_episodes=2, episodes_per_file=2)
    monkeypatch.setenv("WAMKIT_TEST_DATA", str(root))
    monkeypatch.delenv("WAMKIT_TEST_UNSET", raising=False)
    calls = []
    real = env.expand_env
    monkeypatch.setattr(env, "expand_env", lambda text, name: calls.append(name) or real(text, name))
    cfg = load_experiment(DEMO_RECIPE, ['data.path="${WAMKIT_TEST_DATA}"', "data.generate_demo=false",
                                        'data.latent_cache="${WAMKIT_TEST_UNSET}/cache"'])
    assert cfg.data.path == str(root) and sorted(calls) == ["data.latent_cache", "data.path"]
    calls.clear()
    run = build_run_data(cfg)
    build_tokenizers(cfg)
    assert calls == [] and run.dataset.root == root
    with pytest.raises(ConfigError) as err:
        run.samples("train", cfg)  # the cache is needed now: the error load recorded, naming field and variable
    assert err.value.where == "data.latent_cache" and "WAMKIT_TEST_UNSET" in err.value.problem
