"""The engine trains where only torch and transformers are installed (a GPU image, a notebook).

The GPU machine the device check runs on has no Ray, Django, Celery, Channels, PostgreSQL or
Redis clients, nor vLLM. A child process hides every one of them (importing any raises
ModuleNotFoundError, as on that machine) and runs training steps of the single-process trainer,
both on its plain CPU workers and on the one-rank group the CUDA trainer uses.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from tests.engine.command_line import run_python_code

ROOT = Path(__file__).resolve().parents[2]
HIDDEN = (
    "ray",
    "django",
    "celery",
    "channels",
    "channels_redis",
    "daphne",
    "kombu",
    "psycopg",
    "redis",
    "vllm",
    "sglang",
    "webapp",
    "workers",
)

CHILD = textwrap.dedent(
    """
    import importlib.abc, json, sys, tempfile
    from pathlib import Path

    HIDDEN = set(sys.argv[1].split(","))

    class Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in HIDDEN:
                raise ModuleNotFoundError(f"No module named {name!r} (hidden)", name=name)
            return None

    sys.meta_path.insert(0, Hide())

    from engine.config import load_config
    from engine.tiny.task import make_problems, write_split
    from engine.tiny.tokenizer import build_tokenizer
    from engine.trainer import Recorder
    from engine.trainer.ppo_trainer import PPOTrainer
    from tests.engine.distributed.helpers import tiny_policy

    tmp = Path(tempfile.mkdtemp())
    tokenizer = build_tokenizer()
    tiny_policy(len(tokenizer)).save_pretrained(tmp / "model")
    tokenizer.save_pretrained(tmp / "model")
    train, _ = write_split(make_problems("train", 8, seed=0), "train", tmp)

    class Steps(Recorder):
        def __init__(self):
            self.losses = []

        def on_step(self, step, metrics):
            self.losses.append(metrics["actor/pg_loss"])

    def run(trainer_cls):
        config = load_config("grpo_tiny.yaml", overrides=[
            f"actor_rollout_ref.model.path={tmp / 'model'}", f"data.train_files={train}",
            "data.val_files=null", "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=2",
            "trainer.total_training_steps=2", "trainer.test_freq=-1",
            "trainer.val_before_train=False", "trainer.save_freq=-1", "trainer.logger=[]",
            f"trainer.default_local_dir={tmp / 'ckpt'}"])
        steps = Steps()
        status = trainer_cls(config, steps).fit()
        return status, steps.losses

    class OneRankTrainer(PPOTrainer):  # the CUDA trainer's workers, on a CPU
        def _build_workers(self):
            self._build_local_rank()

    plain, one_rank = run(PPOTrainer), run(OneRankTrainer)
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in HIDDEN)
    print(json.dumps({"plain": plain, "one_rank": one_rank, "loaded": loaded}))
    """
)


@pytest.mark.slow
def test_the_trainer_runs_with_ray_django_celery_and_vllm_absent():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = run_python_code(CHILD, ",".join(HIDDEN), cwd=ROOT, env=env, timeout=300)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["loaded"] == []
    assert report["plain"][0] == report["one_rank"][0] == "succeeded"
    assert len(report["plain"][1]) == 2
    # One fp32 CPU rank shards nothing: the same seed gives the same losses on both paths.
    assert report["one_rank"][1] == report["plain"][1]
