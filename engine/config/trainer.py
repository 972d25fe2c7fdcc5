"""``trainer``: the training loop, logging, checkpoints and the workers' machines; ``ray_init``
and verl 0.7's ``ray_kwargs``: how Ray starts.

The rules are at the end: the trackers' libraries, the -1 of the frequencies, the checkpoint to
resume from. That ``ray_init`` and ``ray_kwargs`` agree is checked with verl's other two spellings
(``engine.config.resolve``).
"""

from dataclasses import dataclass

from engine.config.fields import (
    MAX_BATCH,
    MAX_EPOCHS,
    MAX_STEPS,
    MAX_WORKERS,
    ConfigFieldError,
    Validation,
    _f,
    _inert,
    _refused,
    _Section,
    _section,
)
from engine.config.files import file_problems
from engine.config.trackers import TRACKERS, tracker_install_problems


@dataclass
class TrainerConfig(_Section):
    total_epochs: int = _f(30, "Passes over the training data.", basic=True, gt=0, le=MAX_EPOCHS)
    total_training_steps: int | None = _f(
        None, "Stop after this many steps.", basic=True, gt=0, le=MAX_STEPS
    )
    project_name: str = _f("posttrain", "Project the run belongs to.", basic=True)
    experiment_name: str = _f("default", "Name of the run.", basic=True)
    logger: list[str] = _f(["console"], "Metric sinks and trackers.", choices=TRACKERS)
    log_val_generations: int = _f(
        0, "Validation samples logged per validation.", ge=0, le=MAX_BATCH
    )
    log_freq: int = _f(
        1,
        "The console logger prints every N steps (metrics record every step).",
        gt=0,
        le=MAX_STEPS,
    )
    nnodes: int = _f(1, "Machines.", gt=0, le=MAX_WORKERS)
    n_gpus_per_node: int = _f(
        8,
        "Worker processes per machine (GPUs, or CPU ranks).",
        basic=True,
        gt=0,
        le=MAX_WORKERS,
    )
    device: str = _f(
        "auto", "auto: cuda when visible.", choices=("auto", "cpu", "cuda"), basic=True
    )
    controller: str = _f(
        "local", "Run workers in-process or as Ray actors.", choices=("local", "ray")
    )
    balance_batch: bool = _f(True, "Balance tokens across data-parallel ranks.")
    save_freq: int = _f(-1, "Checkpoint every N steps; -1: never.", basic=True, le=MAX_STEPS)
    resume_mode: str = _f("auto", "Resume source.", choices=("auto", "disable", "resume_path"))
    resume_from_path: str | None = _f(
        None, "Checkpoint folder (resume_mode=resume_path).", resource="path"
    )
    test_freq: int = _f(-1, "Validate every N steps; -1: never.", basic=True, le=MAX_STEPS)
    val_before_train: bool = _f(True, "Validate before the first step.")
    val_only: bool = _f(False, "Validate and stop.")
    critic_warmup: int = _f(0, "Steps training only the critic.", ge=0, le=MAX_STEPS)
    default_local_dir: str = _f(
        "checkpoints/${trainer.project_name}/${trainer.experiment_name}",
        "Checkpoint folder.",
        resource="server",
    )
    max_actor_ckpt_to_keep: int | None = _f(
        None,
        "Newest steps whose actor/ state is kept; a step left with no state is deleted; null: all.",
        gt=0,
        le=MAX_STEPS,
    )
    max_critic_ckpt_to_keep: int | None = _f(
        None,
        "Newest steps whose critic/ state is kept; a step left with no state is deleted; "
        "null: all.",
        gt=0,
        le=MAX_STEPS,
    )
    seed: int = _f(1, "Seed of sampling and initialisation.")
    rollout_data_dir: str | None = _refused(
        None,
        "Dump each step's rollouts as JSON lines here.",
        "set trainer.logger to include jsonl (samples.jsonl in the run's folder) instead",
        resource="server",
    )
    validation_data_dir: str | None = _refused(
        None,
        "Dump each validation's generations as JSON lines here.",
        "set trainer.logger to include jsonl (samples.jsonl in the run's folder) instead",
        resource="server",
    )
    esi_redundant_time: int = _inert(0, "Elastic instance: spare seconds before expiry.")
    default_hdfs_dir: str | None = _refused(
        None,
        "Copy checkpoints to HDFS.",
        "checkpoints stay in trainer.default_local_dir",
        resource="server",
    )
    del_local_ckpt_after_load: bool = _refused(
        False,
        "Delete the local checkpoint after resuming from it.",
        "a checkpoint is never deleted on resume; prune with max_actor_ckpt_to_keep",
    )
    ray_wait_register_center_timeout: int = _inert(300, "Seconds to wait for Ray workers.")
    use_legacy_worker_impl: str = _inert("auto", "verl's worker implementation.")


@dataclass
class RayInitConfig(_Section):
    num_cpus: int | None = _f(None, "CPUs Ray may use; null: all.", gt=0, resource="server")
    address: str | None = _f(
        None,
        "Ray cluster address; null: RAY_ADDRESS or POSTTRAIN_RAY_HEAD, else the head that "
        "`ray start` last started on this machine, else a new local one.",
        resource="server",
    )
    include_dashboard: bool = _f(False, "Start Ray's dashboard.", resource="server")


@dataclass
class RayKwargsInitConfig(_Section):
    num_cpus: int | None = _f(
        None, "CPUs Ray may use; null: all (same as ray_init.num_cpus).", gt=0, resource="server"
    )


@dataclass
class RayKwargsConfig(_Section):
    ray_init: RayKwargsInitConfig = _section(RayKwargsInitConfig, "ray.init arguments.")
    timeline_json_file: str | None = _inert(
        None, "Write Ray's task timeline here.", resource="server"
    )


def trainer_problems(v: Validation) -> list[ConfigFieldError]:
    """Return the errors of the trainer's keys: a tracker whose library is missing, a frequency
    that is neither -1 nor positive, and the checkpoint folder of resume_mode=resume_path."""
    trainer: TrainerConfig = v.cfg.trainer
    errors = [
        ConfigFieldError("trainer.logger", trainer.logger, problem)
        for problem in tracker_install_problems(trainer.logger)
    ]
    for name in ("save_freq", "test_freq"):
        value = getattr(trainer, name)
        if not (value == -1 or value > 0):
            errors.append(
                ConfigFieldError(
                    f"trainer.{name}", value, "must be -1 (off) or a positive number of steps"
                )
            )
    if trainer.resume_mode == "resume_path" and not trainer.resume_from_path:
        errors.append(
            ConfigFieldError(
                "trainer.resume_from_path",
                trainer.resume_from_path,
                "resume_mode=resume_path needs a checkpoint folder here",
            )
        )
    if v.check_files and trainer.resume_mode == "resume_path" and trainer.resume_from_path:
        errors += file_problems(
            v,
            "trainer.resume_from_path",
            trainer.resume_from_path,
            "point it at a checkpoint folder",
        )
    return errors
