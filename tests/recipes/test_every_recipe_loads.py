"""Every shipped recipe parses and validates: a knob misspelt or out of range in any of them fails here
(the loader refuses unknown keys), not on a user's GPU."""

from pathlib import Path

import pytest

from wamkit.config import load_experiment
from wamkit.config.loader import read_recipe
from wamkit.distill.config import load_distill_recipe

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "recipes").rglob("*.toml"))


def test_the_recipes_are_found():
    assert "recipes/metaworld_fd_x0.toml" in RECIPES and len(RECIPES) > 10


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_loads(recipe):
    """Training recipes through `wamkit train`'s loader, distillation ones (a [distill] section) through
    `wamkit distill`'s."""
    if "distill" in read_recipe(REPO / recipe):
        cfg, _ = load_distill_recipe(REPO / recipe)
    else:
        cfg = load_experiment(REPO / recipe)
    assert cfg.job.name and cfg.trainer.max_iter > 0
