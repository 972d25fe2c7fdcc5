"""A checkpoint job: ``python -m workers.checkpoint_job <job id>`` exports or evaluates one of a
run's checkpoints and records the outcome (``webapp.runs.checkpoints``).

Started by ``workers.tasks.dispatch_checkpoint_jobs`` as a detached process, once the job is
claimed (running). Without a Hugging Face folder in the checkpoint it merges one first with the
model merger (``engine.model_merger``), from the run's actor state and the model the run started
from, into the run's ``exports/global_step_<N>``: written under a temporary name, marked complete,
then renamed, so a crash never leaves a folder that looks whole. An evaluation then scores that
folder with ``engine.eval.evaluate`` with the run's prompt and response lengths and its data
seed. Its output goes to ``exports/job-<id>.log``.

Failure policy: any error ends the job failed with its message and traceback (the job's page
line shows the message); the exit status is 0 when the end state was recorded. The process beats
the job's heartbeat while it works (:class:`JobHeartbeat`); one killed outright is failed by the
dispatcher's next pass on its host, or on any host once its heartbeat is stale
(``checkpoint_jobs_mark_lost``).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys

from workers.driver import BeatThread, beat_interval_s, setup_studio_process

logger = logging.getLogger("workers.checkpoint_job")


class JobHeartbeat(BeatThread):
    """Beat a running checkpoint job's heartbeat every ``interval_s`` seconds until stopped."""

    def __init__(self, job_id: int, interval_s: float) -> None:
        super().__init__(f"heartbeat-job-{job_id}", interval_s, f"heartbeat of job {job_id}")
        self.job_id = job_id

    def beat(self) -> None:
        from webapp.runs.checkpoints import checkpoint_job_heartbeat

        checkpoint_job_heartbeat(job_id=self.job_id)


def hf_folder_for(job) -> str:
    """Return the checkpoint's Hugging Face folder, merging it first when there is none."""
    from engine.model_merger import merge_checkpoint
    from engine.trainer.checkpoint import step_dir
    from webapp.runs.checkpoints import COMPLETE_FILE, checkpoint_hf_folder, export_folder

    run = job.run
    folder = checkpoint_hf_folder(run, job.step)
    if folder is not None:
        return str(folder)
    target = export_folder(run, job.step)
    partial = target.with_name(f"{target.name}.partial-{job.pk}")
    shutil.rmtree(partial, ignore_errors=True)
    model = run.config["actor_rollout_ref"]["model"]["path"]
    logger.info("merging %s into a Hugging Face folder (model %s)", job, model)
    merge_checkpoint(step_dir(run.checkpoint_dir, job.step) / "actor", partial, hf_model_path=model)
    (partial / COMPLETE_FILE).touch()
    shutil.rmtree(target, ignore_errors=True)  # a folder of an unfinished export before it
    partial.rename(target)
    return str(target)


def run_job(job_id: int) -> str:
    """Do the job ``job_id`` (claimed: running) and record its end; return its end status."""
    from webapp.runs.models import CheckpointJob, CheckpointJobStatus

    job = CheckpointJob.objects.select_related("run").filter(pk=job_id).first()
    if job is None or job.status != CheckpointJobStatus.RUNNING:
        logger.info("checkpoint job %s is not running; nothing to do", job_id)
        return "skipped"
    heartbeat = JobHeartbeat(job_id, beat_interval_s())
    heartbeat.start()
    try:
        return _do_job(job)
    finally:
        heartbeat.stop()
        heartbeat.join(timeout=10)


def _do_job(job) -> str:
    """Export or evaluate the claimed ``job`` and record its end; return its end status."""
    from engine.eval import evaluate
    from webapp.runs.checkpoints import checkpoint_job_finish, failure_text
    from webapp.runs.models import CheckpointJobKind

    job_id = job.pk
    try:
        folder = hf_folder_for(job)
        result = None
        if job.kind == CheckpointJobKind.EVALUATE:
            data = job.run.config.get("data", {})
            options = job.options
            logger.info("evaluating %s on %s", folder, job.dataset)
            result = evaluate(
                folder,
                job.data_files,
                n=options.get("n", 1),
                temperature=options.get("temperature", 1.0),
                max_samples=options.get("max_samples"),
                max_prompt_length=data.get("max_prompt_length", 512),
                max_response_length=data.get("max_response_length", 256),
                data_key_map=job.key_map or {},
                seed=data.get("seed", 1),
                file_key_maps=options.get("file_key_maps") or {},
                file_data_sources=options.get("file_data_sources") or {},
            )
    except Exception as exc:
        logger.exception("%s failed", job)
        checkpoint_job_finish(job_id=job_id, status="failed", error=failure_text(exc))
        return "failed"
    checkpoint_job_finish(job_id=job_id, status="succeeded", result=result)
    return "succeeded"


def main(argv: list[str] | None = None) -> int:
    """Set up the process (threads, Django) and do the job named on the command line."""
    parser = argparse.ArgumentParser(prog="python -m workers.checkpoint_job", description=__doc__)
    parser.add_argument("job_id", type=int, help="primary key of a running checkpoint job")
    args = parser.parse_args(argv)
    setup_studio_process()
    logging.basicConfig(level=logging.INFO)
    status = run_job(args.job_id)
    print(f"checkpoint job {args.job_id}: {status}", flush=True)
    return 0 if status in ("succeeded", "failed", "skipped") else 1


if __name__ == "__main__":
    sys.exit(main())
