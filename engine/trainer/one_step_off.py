"""The one-step-off-policy trainer: batch t+1 is generated while batch t trains.

verl's ``verl/experimental/one_step_off_policy`` (``OneStepOffRayTrainer.fit``), chosen here by
``actor_rollout_ref.hybrid_engine=False``. The rollout runs in a worker process with its own
copy of the policy (``engine.roles.rollout_worker``). At the start of step t the trainer syncs
the actor's weights (after t-1 updates) to the worker and submits batch t+1, then trains on batch
t, which the worker generated during step t-1 with the weights after t-2 updates: every sample
after the first batch is exactly one update stale, and each carries the version that produced it
(``rollout_policy_version``, the number of updates its weights had seen).

Stale samples are corrected as verl corrects them. With ``actor.use_rollout_log_probs`` or
``algorithm.rollout_correction.bypass_mode`` (verl's one-step-off preset) the rollout's own
log-probs are pi_old of the PPO ratio pi_theta / pi_rollout. Otherwise pi_old is recomputed by
the current actor for a stale batch (the on-policy shortcut would take pi_old = pi_theta and
lose the staleness), and ``algorithm.rollout_correction`` weighs each token by pi_old /
pi_rollout (truncated IS, rejection), exactly as for a mismatched rollout engine.

``overlap=False`` submits each batch only after the previous update (staleness 0): the same
samples and updates as the synchronous trainer, from the worker process; the tests compare the
two. The trainer's own rollout (the actor's module) still serves validation and the worker's
weights are those of the latest sync. A checkpoint holds the trained steps and puts the data
loader's position back before the batch in flight: a resumed run draws that batch again and
generates it with the checkpoint's weights (the same prompts, new samples; how many samples that
regenerates is the first step's ``async/regenerated_after_resume``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from engine.algorithms.rollout_correction import weights_in_update
from engine.config import PPOConfig
from engine.config.async_training import CPU_ONLY
from engine.config.fields import ConfigFieldError
from engine.data import DataProto
from engine.roles.actor import needs_sum_pi_squared
from engine.roles.actor_rollout_ref import rollout_build_arguments
from engine.roles.rollout_worker import RolloutWorkerProcess
from engine.trainer.metrics import timer
from engine.trainer.ppo_trainer import PPOTrainer
from engine.trainer.reporting import Recorder
from engine.trainer.samples import POLICY_VERSION, sample_staleness

ASYNC_STATE = "async"  # the asynchronous trainers' part of a checkpoint's controller state


class InFlight(NamedTuple):
    """A batch submitted to the rollout worker and not yet trained on."""

    prompts: DataProto
    batch: DataProto  # the rollout input: ``prompts`` with a uid each, repeated ``rollout.n``
    loader_state: dict[str, Any]  # the data loader's position before the batch was drawn


class OneStepOffPPOTrainer(PPOTrainer):
    """Train with a rollout worker process generating one batch ahead (see the module doc)."""

    # Generated batches the worker may hold for the trainer (0: unbounded; one-step-off's two).
    rollout_queue_size = 0
    # Weights synced mid-batch are loaded between decoding steps (fully-async's partial_rollout).
    partial_rollout = False

    def __init__(
        self, config: PPOConfig, recorder: Recorder | None = None, *, overlap: bool = True
    ):
        self.overlap = overlap
        self.rollout_worker: RolloutWorkerProcess | None = None
        self.in_flight: deque[InFlight] = deque()
        self.synced_version = -1
        self.regenerated_samples = 0  # in flight at the resumed checkpoint, generated again
        self._sync_s = 0.0
        super().__init__(config, recorder)

    def _build_workers(self) -> None:
        """Build the actor (``PPOTrainer``'s workers) and start the rollout worker process."""
        if self.device.type != "cpu":
            raise ConfigFieldError("trainer.device", self.config.trainer.device, CPU_ONLY)
        super()._build_workers()
        arr = self.config.actor_rollout_ref
        self.rollout_worker = RolloutWorkerProcess(
            self.arr.policy_skeleton(),
            self.tokenizer,
            arr.rollout,
            max_new_tokens=arr.rollout.response_length or self.config.data.max_response_length,
            seed=self.config.trainer.seed,
            queue_size=self.rollout_queue_size,
            build_arguments=rollout_build_arguments(self.config),
            partial_rollout=self.partial_rollout,
        )

    def close(self) -> None:
        """Stop the rollout worker and the reward managers' processes."""
        try:
            if self.rollout_worker is not None:
                self.rollout_worker.close()
                self.rollout_worker = None
        finally:
            super().close()

    # -- the one-batch-ahead stream ----------------------------------------------------------
    def prompt_batches(self) -> Iterator[DataProto]:
        """Yield the batches to train on while the worker generates the next one.

        Each ``next`` comes at the start of a step, after the previous update: sync the weights,
        submit the next batch (none after the last step), yield the oldest submitted one.
        """
        source = self.drawn_batches()
        if self.overlap:
            self._sync_and_submit(*next(source))
        while True:
            remaining = self.total_steps - self.global_step
            if len(self.in_flight) < min(remaining, 2 if self.overlap else 1):
                self._sync_and_submit(*next(source))
            yield self.in_flight[0].prompts

    def drawn_batches(self) -> Iterator[tuple[dict[str, Any], DataProto]]:
        """Yield the training loader's batches (``PPOTrainer.prompt_batches``), each with the
        loader's position before it was drawn: where a resumed run draws it again."""
        source = PPOTrainer.prompt_batches(self)
        while True:
            before = self.train_loader.state_dict()
            yield before, next(source)

    def _sync_and_submit(self, loader_state: dict[str, Any], prompts: DataProto) -> None:
        assert self.rollout_worker is not None
        version = self.global_step  # prompt_batches asks at a step's start: global_step updates
        start = time.perf_counter()
        if version != self.synced_version:
            self.rollout_worker.sync_weights(self.arr.full_state_dict(), version)
            self.synced_version = version
        self._sync_s = time.perf_counter() - start
        self.submit(prompts, loader_state)

    def submit(self, prompts: DataProto, loader_state: dict[str, Any]) -> None:
        """Submit the rollout of ``prompts`` to the worker and queue them as in flight
        (``loader_state``: the loader's position before they were drawn)."""
        assert self.rollout_worker is not None
        batch = self.rollout_input(prompts)
        self.rollout_worker.submit(batch)
        self.in_flight.append(InFlight(prompts, batch, loader_state))

    # -- checkpoints: the batches in flight are drawn again on resume ------------------------
    def loop_state(self) -> dict[str, Any]:
        """Put the loader's position back before the batches in flight, so a resumed run draws
        and generates them again (with the checkpoint's weights: the prompts are the same, the
        samples new), and record how many samples that regenerates."""
        if not self.in_flight:
            return {}
        return {
            "dataloader": self.in_flight[0].loader_state,
            ASYNC_STATE: {
                "in_flight_samples": sum(len(entry.batch) for entry in self.in_flight),
                "rollout_policy_version": self.synced_version,
            },
        }

    def restore_loop_state(self, state: dict[str, Any]) -> None:
        """Say how many samples that were in flight at the checkpoint are generated again."""
        self.regenerated_samples = int(state.get(ASYNC_STATE, {}).get("in_flight_samples", 0))
        if self.regenerated_samples:
            print(
                f"{self.regenerated_samples} samples were in flight when the checkpoint was "
                "written; their prompts are drawn and generated again"
            )

    def generate_and_score(
        self, prompts: DataProto, *, timing: dict[str, float]
    ) -> tuple[DataProto, dict]:
        """Return the worker's rollout of ``prompts`` (submitted a step ago), scored and stamped
        with the policy version that generated it; ``timing_s/gen`` is the wait for it."""
        assert self.rollout_worker is not None
        submitted, batch, _ = self.in_flight.popleft()
        if submitted is not prompts:
            raise RuntimeError("the one-step-off trainer trains its batches in submission order")
        with timer("gen", timing):
            gen, version, gen_seconds = self.rollout_worker.result()
        timing["sync_rollout_weights"] = self._sync_s
        timing["rollout_worker_gen"] = gen_seconds
        timing["rollout_worker_gen_cpu"] = gen.meta_info.pop("rollout_worker_cpu_s", 0.0)
        batch, reward_info = self.score_rollout(prompts, batch, gen, timing=timing)
        batch.non_tensor_batch[POLICY_VERSION] = np.full(len(batch), version, dtype=np.int64)
        return batch, reward_info

    def needs_old_log_prob(self, batch: DataProto) -> bool:
        """Return True for a stale batch too: its pi_old is not the current policy."""
        return self.staleness(batch).max() > 0 or super().needs_old_log_prob(batch)

    def rollout_is_in_update(self, batch: DataProto) -> bool:
        """Return True when pi_old needs no pass of its own: the update sees the batch once, in
        one mini-batch, so before its optimizer step the policy it computes is pi_old (the
        actor's weights when the step began) whatever policy sampled the batch; with token or
        sequence IS alone (``weights_in_update``) each micro-batch's weights come from that
        forward, the same numbers the pass would give (``test_one_step_off``). Anything that
        reads pi_old before the update keeps the pass: checking the rollout's log-probs, a KL
        penalty in the reward, the optimal token baselines. The update hands the weights back
        in the batch, for the samples' records: an actor in this process writes them there,
        a group of ranks returns each rank's rows (``ActorRolloutRefGroup.update_actor``)."""
        config = self.config
        return (
            weights_in_update(config.algorithm.rollout_correction)
            and not config.actor_rollout_ref.rollout.calculate_log_probs
            and not config.algorithm.use_kl_in_reward
            and not needs_sum_pi_squared(config)
            and not config.algorithm.use_pf_ppo  # it updates on a resample of the batch
            and not self.arr.needs_old_log_prob(len(batch))  # one epoch, one mini-batch
        )

    def staleness(self, batch: DataProto) -> np.ndarray:
        """Return each sample's staleness (bs,): updates between its policy and the actor's."""
        # train_step runs before this step's update: the actor has made global_step - 1.
        return sample_staleness(self.global_step, batch.non_tensor_batch[POLICY_VERSION])

    def train_step(
        self, prompts: DataProto, more_prompts: Iterator[DataProto] | None = None
    ) -> tuple[dict[str, float], DataProto, dict]:
        """Run ``PPOTrainer.train_step`` on the batch generated a step ago; add the staleness
        (``async/staleness_mean``, ``_max``) and the version of its policy to the metrics."""
        metrics, batch, reward_info = super().train_step(prompts, more_prompts)
        lag = self.staleness(batch)
        metrics["async/staleness_mean"] = float(lag.mean())
        metrics["async/staleness_max"] = float(lag.max())
        metrics["async/rollout_policy_version"] = float(
            batch.non_tensor_batch[POLICY_VERSION].max()
        )
        if self.regenerated_samples:  # the first step after a resume
            metrics["async/regenerated_after_resume"] = float(self.regenerated_samples)
            self.regenerated_samples = 0
        return metrics, batch, reward_info
