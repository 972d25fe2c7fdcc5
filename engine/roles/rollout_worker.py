"""The detached rollout worker: a process of its own holding a copy of the policy and its rollout
engine, so generation really runs beside training (verl's ``DetachAsyncRolloutWorker`` of
``verl/experimental/one_step_off_policy``; on a CPU a process, not a thread: the GIL and torch's
intra-op pool would serialise a thread).

The engine is the run's ``actor_rollout_ref.rollout.name``, built as the trainer builds its own
(``get_rollout``): ``hf`` samples from the policy copy, ``vllm`` runs a vLLM engine in the worker
that loads each synced copy through its ``load_weights`` (the colocated path's bucketed reload),
and with ``multi_turn.enable`` either is wrapped in the multi-turn loop, whose tool calls and
interactions run in the worker too.

The trainer talks to it through two queues, and the worker answers in the order it was asked:
``sync_weights`` (the policy's parameters and their version: how many updates made them),
``submit`` (generate a batch with the weights last synced) and ``result`` (the oldest submitted
batch, stamped with the version that produced it). Sending never waits for the worker: a queue's
feeder thread writes while the worker generates. Between two batches the worker reads every
request already sent, so weights synced while batches wait their turn are the ones those
batches are generated with (a batch in flight finishes with the weights it started with, as
verl's rollouter without partial rollout; with it, weights that arrive mid-batch are loaded
between two decoding steps and the rest of the batch is sampled under them, every token stamped
with its version); of several syncs sent meanwhile only the last is loaded. ``queue_size``
bounds the finished batches waiting for the trainer (the fully-async trainer's queue): a worker
that fills it waits. Everything travels as ``torch.save`` bytes, so
no tensor in either process shares memory with the other (a shared tensor breaks once its
process exits). Sampling draws from the worker's own generator seeded as the in-process
rollout's (``trainer.seed``), so with the same weights it samples the same tokens.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import queue
import time
import traceback
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from engine.data import DataProto

if TYPE_CHECKING:
    from engine.config import RolloutConfig
    from engine.roles.model_loading import PolicySkeleton

# Seconds to wait for a batch before checking that the worker is still alive.
_POLL_S = 1.0
# Seconds the worker gets to exit after being asked to stop, before it is terminated.
_STOP_S = 10.0


def _pack(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _unpack(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=False)


class RolloutWorkerProcess:
    """Generate rollouts in a worker process with a copy of the policy (see the module doc)."""

    def __init__(
        self,
        skeleton: PolicySkeleton,
        tokenizer: Any,
        rollout_config: RolloutConfig,
        *,
        max_new_tokens: int,
        seed: int,
        queue_size: int = 0,
        build_arguments: dict[str, Any] | None = None,
        partial_rollout: bool = False,
    ) -> None:
        """Start the worker with a weightless policy copy built from ``skeleton`` (the weights
        come with the first :meth:`sync_weights`); ``build_arguments`` are ``get_rollout``'s
        besides the seed (``engine.roles.actor_rollout_ref.rollout_build_arguments``: a served
        engine's model path and overrides, the chat template's arguments); with
        ``partial_rollout`` weights synced while a batch generates are loaded between its
        decoding steps (the ``hf`` rollout's ``interrupt``)."""
        context = mp.get_context("spawn")
        self.requests: Any = context.Queue()
        self.replies: Any = context.Queue(maxsize=queue_size)
        self.in_flight = 0
        # Replies read off the queue by ``ready`` and not yet returned by ``result``.
        self.received: deque[tuple[str, Any]] = deque()  # (kind, bytes or traceback)
        setup = {
            **skeleton._asdict(),
            "tokenizer": tokenizer,
            "rollout_config": rollout_config,
            "max_new_tokens": max_new_tokens,
            "seed": seed,
            "build_arguments": build_arguments or {},
            "partial_rollout": partial_rollout,
        }
        self.process = context.Process(
            target=_serve,
            args=(self.requests, self.replies, _pack(setup)),
            name="rollout-worker",
            daemon=True,
        )
        self.process.start()

    def sync_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Queue the policy's full weights (CPU tensors, after ``version`` updates); the next
        generation uses them."""
        self.requests.put(("weights", _pack((state, version))))

    def submit(self, prompts: DataProto) -> None:
        """Queue the generation of ``prompts`` (already repeated ``rollout.n`` times)."""
        self.requests.put(("generate", _pack(prompts)))
        self.in_flight += 1

    def result(self) -> tuple[DataProto, int, float]:
        """Return the oldest submitted batch's rollout, the policy version that generated it and
        the seconds the worker spent generating it; wait for it if needed.

        A failure in the worker is raised here with its traceback; a worker that died is a
        RuntimeError with its exit code.
        """
        if self.in_flight == 0:
            raise RuntimeError("no rollout was submitted to the rollout worker")
        while not self.received:
            try:
                self.received.append(self.replies.get(timeout=_POLL_S))
            except queue.Empty:
                if not self.process.is_alive():
                    raise RuntimeError(
                        f"the rollout worker process exited (code {self.process.exitcode}) "
                        "with a batch in flight; see its output above"
                    ) from None
        kind, payload = self.received.popleft()
        if kind == "error":
            raise RuntimeError(f"the rollout worker failed:\n{payload}")
        self.in_flight -= 1
        out, version, seconds = _unpack(payload)
        return out, version, seconds

    def ready(self) -> int:
        """Return how many submitted batches are generated and not yet taken by ``result``."""
        while True:
            try:
                self.received.append(self.replies.get_nowait())
            except queue.Empty:
                return len(self.received)

    def close(self) -> None:
        """Stop the worker process (terminated if it does not exit in time)."""
        if self.process.is_alive():
            self.requests.put(("stop", b""))
            self.process.join(_STOP_S)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(_STOP_S)
        # Requests the worker never read would block the feeder thread at exit (the pipe is full
        # and no one reads it): drop them.
        self.requests.cancel_join_thread()
        self.requests.close()
        self.replies.close()


class _Stopped(Exception):
    """The trainer asked the worker to stop while it generated."""


def _serve(requests: Any, replies: Any, setup_bytes: bytes) -> None:
    """The worker process: build the policy copy, then answer requests in order until stopped."""
    try:
        worker = _RolloutWorker(_unpack(setup_bytes))
        waiting: deque[bytes] = deque()  # batches to generate, in the order submitted

        def read(*, block: bool) -> bytes | None:
            """Queue every request sent so far (waiting for one if ``block``); return the
            newest weights among them (only the last are ever generated with), if any."""
            pending = [requests.get()] if block else []
            while True:
                try:
                    pending.append(requests.get_nowait())
                except queue.Empty:
                    break
            newest = None
            for kind, payload in pending:
                if kind == "stop":
                    raise _Stopped
                if kind == "weights":
                    newest = payload
                elif kind == "generate":
                    waiting.append(payload)
            return newest

        def load_newest(*, block: bool) -> bool:
            """Read the requests (see ``read``); load the newest weights among them, if any."""
            newest = read(block=block)
            if newest is not None:
                worker.load(*_unpack(newest))
            return newest is not None

        def interrupt() -> int | None:
            """Between two decoding steps: load weights synced meanwhile (partial rollout)."""
            return worker.version if load_newest(block=False) else None

        while True:
            # Wait for a request only when idle; otherwise read what has come, so the newest
            # weights are loaded before the next batch starts.
            load_newest(block=not waiting)
            if waiting:
                prompts = _unpack(waiting.popleft())
                result = worker.generate(prompts, interrupt if worker.partial else None)
                replies.put(("ok", _pack(result)))
    except _Stopped:
        return
    except BaseException:
        replies.put(("error", traceback.format_exc()))


class _RolloutWorker:
    """What the worker process holds: the policy copy, its rollout engine and its generator."""

    def __init__(self, setup: dict[str, Any]) -> None:
        from transformers import AutoModelForCausalLM

        from engine.env import apply_cpu_process_env
        from engine.roles.actor_rollout_ref import get_rollout

        apply_cpu_process_env()
        model = AutoModelForCausalLM.from_config(setup["model_config"], dtype=setup["dtype"])
        if setup["generation_config"] is not None:
            model.generation_config = setup["generation_config"]
        model.config.use_cache = True
        self.model = model.eval()
        self.config = setup["rollout_config"]
        self.rollout = get_rollout(
            self.config.name,
            self.model,
            setup["tokenizer"],
            self.config,
            seed=setup["seed"],
            **setup["build_arguments"],
        )
        self.max_new_tokens = setup["max_new_tokens"]
        self.partial = bool(setup["partial_rollout"])
        self.generator = torch.Generator(device="cpu").manual_seed(setup["seed"])
        self.version = -1  # no weights yet: the trainer syncs before its first batch

    def load(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Load the policy's weights after ``version`` updates."""
        self.model.load_state_dict(state)
        self.rollout.load_weights(self.model)  # a served engine copies them into its own model
        self.version = version

    def generate(
        self, prompts: DataProto, interrupt: Callable[[], int | None] | None = None
    ) -> tuple[DataProto, int, float]:
        """Return the rollout of ``prompts``, the version of the weights it started with and the
        seconds taken. With ``interrupt`` (partial rollout) newer weights synced meanwhile are
        loaded between decoding steps and the rest is sampled under them; the rollout then
        carries ``rollout_token_versions`` (bs, T)."""
        from engine.roles.actor_rollout_ref import sampling_params

        if self.version < 0:
            raise RuntimeError("the rollout worker was asked to generate before any weight sync")
        start, cpu_start = time.perf_counter(), time.process_time()
        version = self.version
        partial = {"version": version, "interrupt": interrupt} if interrupt is not None else {}
        out = self.rollout.generate_sequences(
            prompts,
            max_new_tokens=self.max_new_tokens,
            sampling=sampling_params(self.config, validate=False),
            generator=self.generator,
            **partial,
        )
        # CPU seconds against wall seconds: what the work took, and what waiting for a core added.
        out.meta_info["rollout_worker_cpu_s"] = time.process_time() - cpu_start
        return out, version, time.perf_counter() - start
