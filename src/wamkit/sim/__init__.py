"""Simulators: env adapters with scripted experts (`envs`), demonstration recording to LeRobot v3.0
(`record`, `writer`). Closed-loop evaluation lives in `wamkit.eval.sim_eval`.

Importing this package does not import MuJoCo; it sets MUJOCO_GL (egl where libEGL exists, else osmesa)
unless already set, so import it before mujoco/metaworld."""

from wamkit.sim.base import EnvSpec, SimEnv, SimError, ensure_gl_backend
from wamkit.sim.envs import REGISTRY, SUITES, env_names, expand_env_names, get_spec, make_env
from wamkit.sim.record import RecordSummary, record, sim_record_main
from wamkit.data.writer import RecordedEpisode, write_lerobot_dataset

ensure_gl_backend()  # only sets MUJOCO_GL (if unset) so later mujoco/metaworld imports render headless

__all__ = ["REGISTRY", "SUITES", "expand_env_names", "EnvSpec", "SimEnv", "SimError", "env_names", "ensure_gl_backend", "get_spec", "make_env",
           "RecordSummary", "record", "sim_record_main", "RecordedEpisode", "write_lerobot_dataset"]
