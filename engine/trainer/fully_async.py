"""The fully-asynchronous trainer: a streaming rollouter, a bounded queue, periodic weight syncs.

verl's ``verl/experimental/fully_async_policy`` (``FullyAsyncRollouter`` and
``FullyAsyncTrainer`` around a ``MessageQueue``), selected here by
``actor_rollout_ref.hybrid_engine=False`` with ``async_training.*`` keys
(``engine.config.async_training``). The rollout worker process (``engine.roles.rollout_worker``)
generates chunks of ``actor.ppo_mini_batch_size`` prompts (``rollout.n`` responses each) one
after another and pushes each into its reply queue; the trainer takes ``require_batches`` chunks
per step, in the order they were generated, and sends its weights every
``trigger_parameter_sync_step`` steps.

How far the rollouter runs ahead is verl's budget: at most ``queue_chunks`` =
floor(require_batches x trigger_parameter_sync_step x (1 + staleness_threshold)) chunks are
generated and not yet trained on at any time (verl's ``max_required_samples``, counting the
samples left in the queue at a sync against the next window as verl's rollouter does). The
controller owns the prompt stream: at each sync it sends the weights, then tops the chunks in
flight up to that budget, and the worker pauses once it has generated them, until the next sync
tops it up again. The reply queue is bounded by the same number. A chunk is generated with the
newest weights synced when it starts (the worker reads every waiting request between chunks); a
chunk in flight at a sync finishes with its weights, or, with ``async_training.partial_rollout``,
goes on under the new ones from the next decoding step (``engine.rollout.sampling``'s
``interrupt``; each token stamped in ``rollout_token_versions``, the sample with the version it
started with; ``async/partial_rollout_samples`` counts those finished by newer weights).

Every sample carries ``rollout_policy_version`` (the updates its weights had seen). A chunk
submitted at a sync sits at most ``queue_chunks`` chunks from the queue's head, so it lags the
actor by at most ``max_staleness`` = ceil(queue_chunks / require_batches) - 1 updates. The
trainer drops a chunk older than that (``async/dropped_stale_samples``), which the budget above
never lets happen; the check makes the bound a guarantee of what is trained on, not only of the
accounting, and a dropped chunk is replaced by one generated with the actor's weights (sent to
the worker again then). Stale samples are corrected as the one-step-off trainer corrects them
(``engine.trainer.one_step_off``): pi_old is the rollout's log-probs (``use_rollout_log_probs``,
bypass mode) or recomputed by the current actor, and ``algorithm.rollout_correction`` weighs
pi_old / pi_rollout. A checkpoint holds the trained steps and the loader's position before the
chunks in flight (a step takes whole loader batches, so they start a batch): a resumed run syncs,
draws those prompts again and refills the queue at its first step.

With ``staleness_threshold=0`` and ``trigger_parameter_sync_step=1`` the budget is one step: each
step's chunks are submitted after the previous update, and the samples and updates are those of
the synchronous trainer (the tests compare the two). Metrics beside one-step-off's
``async/staleness_*``: ``async/queue_size`` (generated samples waiting after the step's take),
``async/dropped_stale_samples`` (and ``_total``), ``async/max_allowed_staleness``,
``timing_s/gen`` (the trainer's wait for the queue), ``timing_s/rollout_worker_gen`` (the
worker's generation of the step's chunks) and ``timing_s/sync_rollout_weights``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from engine.config import PPOConfig
from engine.config.async_training import FullyAsyncSettings, fully_async_settings
from engine.data import DataProto
from engine.rollout.sampling import TOKEN_VERSIONS
from engine.trainer.dynamic_sampling import pad_to_common_width
from engine.trainer.one_step_off import OneStepOffPPOTrainer
from engine.trainer.reporting import Recorder
from engine.trainer.samples import POLICY_VERSION


def partial_rollout_samples(gen: DataProto, version: int) -> int:
    """Return how many samples of a partial rollout ``gen`` went on under weights newer than
    the ``version`` they started with (0 for a rollout without per-token versions)."""
    if TOKEN_VERSIONS not in gen.batch:
        return 0
    versions = gen.batch[TOKEN_VERSIONS].masked_fill(gen.batch["response_mask"] == 0, -1)
    return int((versions.max(-1).values > version).sum())


class FullyAsyncPPOTrainer(OneStepOffPPOTrainer):
    """Train from a bounded queue a rollout worker process streams into (see the module doc)."""

    settings: FullyAsyncSettings

    def __init__(self, config: PPOConfig, recorder: Recorder | None = None):
        self.chunks: Iterator[tuple[dict[str, Any], DataProto]] | None = None
        self.dropped_total = 0
        self.step_stats: dict[str, float] = {}
        super().__init__(config, recorder, overlap=True)

    def _build_workers(self) -> None:
        """Apply the fully-async keys (validated by now), then build the workers and the
        rollout worker with a queue of ``queue_chunks``."""
        config = self.config
        self.settings = fully_async_settings(config)
        self.rollout_queue_size = self.settings.queue_chunks
        self.partial_rollout = bool(config.async_training.partial_rollout)
        async_cfg, pool = config.async_training, config.rollout
        # verl's fully-async config sets the actor's key from async_training's.
        if async_cfg.use_rollout_log_probs is not None:
            config.actor_rollout_ref.actor.use_rollout_log_probs = async_cfg.use_rollout_log_probs
        if pool.total_rollout_steps is not None:
            steps = pool.total_rollout_steps // config.data.train_batch_size
            config.trainer.total_training_steps = steps
            self.total_steps = steps
        if pool.test_freq is not None:
            config.trainer.test_freq = pool.test_freq * self.settings.trigger_parameter_sync_step
        super()._build_workers()

    # -- the stream ----------------------------------------------------------------------------
    def prompt_chunks(self) -> Iterator[tuple[dict[str, Any], DataProto]]:
        """Yield the training loader's batches cut into ``require_batches`` mini-batch chunks,
        each with the loader's position before its batch was drawn."""
        for loader_state, batch in self.drawn_batches():
            for chunk in batch.chunk(self.settings.require_batches):
                yield loader_state, chunk

    def prompt_batches(self) -> Iterator[DataProto]:
        """Yield the first chunk of each step's batch; sync and top up the rollouter first.

        Each ``next`` comes at a step's start: after ``trigger_parameter_sync_step`` updates
        since the last sync (and at the first step, resumed or not) the weights go to the
        worker and the chunks in flight are topped up to the budget. ``generate_and_score``
        takes the step's chunks from the head of the queue.
        """
        self.chunks = self.prompt_chunks()
        while True:
            since_sync = self.global_step - self.synced_version
            if self.synced_version < 0 or since_sync >= self.settings.trigger_parameter_sync_step:
                self.sync_and_top_up()
            yield self.in_flight[0].prompts

    def sync_and_top_up(self) -> None:
        """Send the actor's weights to the worker, then submit chunks up to the budget."""
        self.sync_weights(self.global_step)
        still_needed = (self.total_steps - self.global_step) * self.settings.require_batches
        while len(self.in_flight) < min(self.settings.queue_chunks, still_needed):
            self.submit_chunk()

    def sync_weights(self, version: int) -> None:
        """Send the actor's weights (after ``version`` updates) to the worker."""
        assert self.rollout_worker is not None
        start = time.perf_counter()
        self.rollout_worker.sync_weights(self.arr.full_state_dict(), version)
        self.synced_version = version
        self._sync_s += time.perf_counter() - start

    def submit_chunk(self) -> None:
        """Submit the next chunk of prompts to the worker."""
        assert self.chunks is not None
        loader_state, chunk = next(self.chunks)
        self.submit(chunk, loader_state)

    def generate_and_score(
        self, prompts: DataProto, *, timing: dict[str, float]
    ) -> tuple[DataProto, dict]:
        """Take the step's ``require_batches`` chunks from the queue (a chunk staler than
        ``max_staleness`` is dropped and replaced), join, stamp and score them."""
        assert self.rollout_worker is not None
        if self.in_flight[0].prompts is not prompts:
            raise RuntimeError("the fully-async trainer takes its chunks in submission order")
        current = self.global_step - 1  # the actor's version: train_step runs before its update
        parts: list[DataProto] = []
        wait_s = gen_s = gen_cpu_s = 0.0
        dropped = resumed = 0
        while len(parts) < self.settings.require_batches:
            batch = self.in_flight.popleft().batch
            start = time.perf_counter()
            gen, version, seconds = self.rollout_worker.result()
            wait_s += time.perf_counter() - start
            gen_s += seconds
            gen_cpu_s += gen.meta_info.pop("rollout_worker_cpu_s", 0.0)
            if current - version > self.settings.max_staleness:
                # The replacement is generated with the actor's weights, sent again whatever the
                # worker was sent before: it cannot be dropped in its turn.
                if not dropped:
                    self.sync_weights(current)
                dropped += len(batch)
                self.submit_chunk()
                continue
            resumed += partial_rollout_samples(gen, version)
            joined = self.join_rollout(batch, gen, timing=timing)
            joined.non_tensor_batch[POLICY_VERSION] = np.full(len(joined), version, dtype=np.int64)
            parts.append(joined)
        samples_per_chunk = self.config.actor_rollout_ref.actor.ppo_mini_batch_size * (
            self.config.actor_rollout_ref.rollout.n
        )
        self.dropped_total += dropped
        self.step_stats = {
            "async/queue_size": float(self.rollout_worker.ready() * samples_per_chunk),
            "async/dropped_stale_samples": float(dropped),
            "async/dropped_stale_samples_total": float(self.dropped_total),
            "async/max_allowed_staleness": float(self.settings.max_staleness),
        }
        if self.partial_rollout:
            self.step_stats["async/partial_rollout_samples"] = float(resumed)
        timing["gen"] = wait_s
        timing["sync_rollout_weights"], self._sync_s = self._sync_s, 0.0
        timing["rollout_worker_gen"] = gen_s
        timing["rollout_worker_gen_cpu"] = gen_cpu_s
        joined = (
            DataProto.concat(pad_to_common_width(parts, self.tokenizer.pad_token_id))
            if len(parts) > 1
            else parts[0]
        )
        return self.score_joined(prompts, joined, timing=timing)

    def needs_old_log_prob(self, batch: DataProto) -> bool:
        """Return True with ``async_training.compute_prox_log_prob`` too (pi_old recomputed
        for every batch), else as the one-step-off trainer."""
        return bool(self.config.async_training.compute_prox_log_prob) or (
            super().needs_old_log_prob(batch)
        )

    def rollout_is_in_update(self, batch: DataProto) -> bool:
        """As the one-step-off trainer, unless ``async_training.compute_prox_log_prob`` asks
        for the pi_old pass on every batch."""
        return not self.config.async_training.compute_prox_log_prob and (
            super().rollout_is_in_update(batch)
        )

    def train_step(
        self, prompts: DataProto, more_prompts: Iterator[DataProto] | None = None
    ) -> tuple[dict[str, float], DataProto, dict]:
        """Run the one-step-off ``train_step`` on the step's chunks; add the queue's metrics."""
        metrics, batch, reward_info = super().train_step(prompts, more_prompts)
        metrics.update(self.step_stats)
        return metrics, batch, reward_info
