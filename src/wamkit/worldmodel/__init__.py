"""World-model (forward-dynamics) sampling, rollouts along recorded episodes, metrics and reports.
See docs/world_model.md."""

from wamkit.worldmodel.report import eval_wm_main, evaluate
from wamkit.worldmodel.rollout import MODES, WorldModel, WorldModelError, load_episode, probe_episode, rollout_episode
from wamkit.worldmodel.sampling import SEED_EVAL_SETTING, sample_video

__all__ = ["MODES", "SEED_EVAL_SETTING", "WorldModel", "WorldModelError", "eval_wm_main", "evaluate", "load_episode",
           "probe_episode", "rollout_episode", "sample_video"]
