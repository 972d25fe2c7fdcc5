"""Score many samples with one reward function, in this process or in a process pool.

A function that raises for one sample fails only that sample: its outcome carries
``"ExceptionType: message"`` instead of a result, and the others are scored as usual. So does a
result that is neither a number nor a dict with a ``score`` key. Outcomes keep the input order.

:class:`WorkerPool` holds the worker processes; :func:`score_samples_timed` adds a per-sample
timeout and survives a worker that hangs or dies (verl's PRIME manager's guarantees).
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import pickle
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import (
    FIRST_COMPLETED,
    CancelledError,
    Executor,
    Future,
    ProcessPoolExecutor,
    wait,
)
from concurrent.futures.process import BrokenProcessPool
from itertools import repeat
from typing import Any, NamedTuple

from engine.rewards.sandbox import SandboxUnavailable


class RewardInput(NamedTuple):
    """The arguments of a uniform reward function for one sample."""

    data_source: str
    solution_str: str
    ground_truth: Any
    extra_info: dict[str, Any] | None


class RewardOutcome(NamedTuple):
    """A float or ``{"score": ..., ...}`` result, or the error that replaced it."""

    result: float | dict[str, Any] | None
    error: str | None


def describe_error(exc: BaseException) -> str:
    """Return ``"ExceptionType: message"``."""
    return f"{type(exc).__name__}: {exc}"


def check_result(result: Any) -> float | dict[str, Any]:
    """Return a reward result as a float or a dict with a float ``score``; raise if it is neither."""
    if isinstance(result, dict):
        if "score" not in result:
            raise TypeError(
                f"reward function returned a dict without a 'score' key (keys: {sorted(result)}); "
                "put the total reward under 'score'"
            )
        return {**result, "score": float(result["score"])}
    if isinstance(result, int | float):  # bool is an int
        return float(result)
    raise TypeError(
        f"reward function returned {type(result).__name__}; return a float or a dict with a "
        "'score' key"
    )


def score_one(fn: Callable[..., Any], sample: RewardInput) -> RewardOutcome:
    """Return the outcome of ``fn`` on one sample, catching what it raises."""
    try:
        return RewardOutcome(check_result(fn(*sample)), None)
    except SandboxUnavailable:  # concerns every sample: fails the run with its one sentence
        raise
    except Exception as exc:
        return RewardOutcome(None, describe_error(exc))


def check_picklable(fn: object) -> None:
    """Raise TypeError unless ``fn`` can be sent to a worker process."""
    try:
        pickle.dumps(fn)
    except Exception as exc:
        raise TypeError(
            f"reward function {fn!r} cannot be sent to worker processes ({exc}); with "
            "num_workers > 1 use a function defined at module level of an importable module "
            "(or a registered or custom_reward_function one), or set num_workers=1"
        ) from exc


def score_samples(
    fn: Callable[..., Any], samples: Sequence[RewardInput], executor: Executor | None = None
) -> list[RewardOutcome]:
    """Return the outcome of ``fn`` on each sample, in order, using ``executor`` when given."""
    if executor is None:
        return [score_one(fn, sample) for sample in samples]
    return list(executor.map(score_one, repeat(fn), samples))


class WorkerPool:
    """``workers`` spawn-context processes for reward functions, started on first use and reused.

    Functions sent to them must be importable (registered, ``custom_reward_function`` or
    module-level ones). Each worker reports when a call sent with :meth:`submit_reported`
    starts, so a timeout can count from then rather than from a process start-up. :meth:`discard`
    kills the processes, even one stuck in a function that never returns, so the next use starts
    a fresh pool.
    """

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"a worker pool needs at least one process, got {workers}")
        self.workers = workers
        self._executor: ProcessPoolExecutor | None = None
        self._starts: Any = None  # the workers' (call, start time) reports
        self._calls = itertools.count()

    @property
    def executor(self) -> ProcessPoolExecutor:
        """Return the running pool, starting it if there is none."""
        if self._executor is None:
            context = multiprocessing.get_context("spawn")
            self._starts = context.SimpleQueue()
            self._executor = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=context,
                initializer=_init_worker,
                initargs=(self._starts,),
            )
        return self._executor

    def submit_reported(
        self, fn: Callable[..., Any], sample: RewardInput
    ) -> tuple[Future[RewardOutcome], int]:
        """Send ``score_one(fn, sample)`` to a worker; return its future and its call number."""
        call = next(self._calls)
        return self.executor.submit(_score_reported, fn, sample, call), call

    def starts(self) -> dict[int, float]:
        """Return ``{call: start time.time()}`` reported since the last look."""
        reports: dict[int, float] = {}
        while self._starts is not None and not self._starts.empty():
            call, started = self._starts.get()
            reports[call] = started
        return reports

    def discard(self) -> None:
        """Kill the worker processes and forget the pool (a hung function ignores a shutdown)."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        # ProcessPoolExecutor has no public way to stop a running call; verl's PRIME manager
        # terminates the same private table of processes.
        processes = list((executor._processes or {}).values())
        for process in processes:
            process.terminate()
        executor.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.join(timeout=1.0)
            if process.is_alive():  # ignored SIGTERM
                process.kill()
                process.join()
        self._starts.close()
        self._starts = None

    def close(self) -> None:
        """Shut the pool down once running calls finish (a later use starts a new one)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
            self._starts.close()
            self._starts = None


_starts: Any = None  # in a worker process: the pool's queue of start reports


def _init_worker(starts: Any) -> None:
    global _starts
    _starts = starts


def _score_reported(fn: Callable[..., Any], sample: RewardInput, call: int) -> RewardOutcome:
    _starts.put((call, time.time()))
    return score_one(fn, sample)


class _Call(NamedTuple):
    """A sample sent to a worker: its index, call number, deadline and whether it started."""

    sample: int
    call: int
    deadline: float  # time.time()
    started: bool


# How long a sent call may wait for its worker process to start before it counts as timed out.
STARTUP_S = 120.0
# How often the pool's start reports are read while a call has not reported its start.
_POLL_S = 0.2


def score_samples_timed(
    fn: Callable[..., Any], samples: Sequence[RewardInput], pool: WorkerPool, timeout: float
) -> list[RewardOutcome]:
    """Return the outcome of ``fn`` on each sample, scored in ``pool``, each within ``timeout`` s.

    At most ``pool.workers`` samples are out at once, and a sample's clock starts when its
    worker starts it, so neither waiting behind the others (verl's PRIME manager starts every
    clock at once) nor a worker's start-up counts; a worker not started within
    :data:`STARTUP_S` counts as a timeout too. A sample still running at its deadline fails with
    ``TimeoutError``; its worker stays busy, and once every worker is stuck the pool is killed
    and a new one scores the rest. A worker that dies (``os._exit``, a crash, the OOM killer)
    breaks the whole pool: the samples being scored at that moment fail with
    ``BrokenProcessPool``, since nothing tells which of them killed it (with one worker, only the
    culprit), and a new pool scores the rest, where verl's manager scores the whole batch 0. A
    pool left with a stuck worker is killed before returning, so the next call starts clean.
    """
    if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
    outcomes: list[RewardOutcome | None] = [None] * len(samples)
    waiting = deque(range(len(samples)))
    running: dict[Future[RewardOutcome], _Call] = {}
    stuck: list[Future[RewardOutcome]] = []  # timed out, still holding a worker
    while waiting or running:
        stuck = [future for future in stuck if not future.done()]
        if not running and len(stuck) >= pool.workers:  # every worker hangs
            pool.discard()
            stuck = []
        while waiting and len(running) + len(stuck) < pool.workers:
            i = waiting.popleft()
            future, call = pool.submit_reported(fn, samples[i])
            running[future] = _Call(i, call, time.time() + STARTUP_S, started=False)
        starts = pool.starts()
        for future, sent in running.items():
            if sent.call in starts:
                running[future] = sent._replace(deadline=starts[sent.call] + timeout, started=True)
        pause = max(0.0, min(sent.deadline for sent in running.values()) - time.time())
        if not all(sent.started for sent in running.values()):
            pause = min(pause, _POLL_S)  # read the start reports again soon
        wait(running, pause, FIRST_COMPLETED)
        now, broken = time.time(), False
        for future, sent in list(running.items()):
            if future.done():
                del running[future]
                outcomes[sent.sample], died = _collect(future)
                broken = broken or died
            elif now >= sent.deadline:
                del running[future]
                stuck.append(future)
                outcomes[sent.sample] = RewardOutcome(
                    None,
                    f"TimeoutError: the reward function ran past its {timeout:g} s timeout"
                    if sent.started
                    else f"TimeoutError: no worker process started it within {STARTUP_S:g} s",
                )
        if broken:  # the calls still running fail with the same BrokenProcessPool
            pool.discard()
            wait(running)
            for future, sent in running.items():
                outcomes[sent.sample], _ = _collect(future)
            running.clear()
            stuck = []
    if any(not future.done() for future in stuck):
        pool.discard()
    return outcomes  # type: ignore[return-value]  # every sample has its outcome


def _collect(future: Future[RewardOutcome]) -> tuple[RewardOutcome, bool]:
    """Return a finished call's outcome and whether its worker process died."""
    try:
        return future.result(), False
    except (BrokenProcessPool, CancelledError) as exc:
        return RewardOutcome(None, describe_error(exc)), True
