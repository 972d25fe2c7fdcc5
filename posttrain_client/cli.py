"""The ``posttrain`` command: ``posttrain watch`` streams a verl run's files into a studio.

    posttrain watch --rollout-dir ./rollouts -- python -m verl.trainer.main_ppo \\
        trainer.logger=[console,file] trainer.rollout_data_dir=./rollouts ...

The studio and the token come from ``POSTTRAIN_URL`` and ``POSTTRAIN_TOKEN`` (or ``--url`` and
``--token``); docs/verl.md walks through it.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

from posttrain_client.client import Studio, StudioError
from posttrain_client.external import StudioUnreachable
from posttrain_client.watch import Watcher, WatchOptions


def watch_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "watch",
        help="stream a verl run's file log and rollout dumps into the studio",
        description=(
            "Create a run in the studio and send a verl run's metrics (its file logger's JSONL), "
            "train rollouts (trainer.rollout_data_dir) and validation generations "
            "(trainer.validation_data_dir) as verl writes them. With a command after --, run it, "
            "send its output as the run's log and finish the run with its outcome. Started "
            "again, it goes on where it stopped (its state file)."
        ),
    )
    p.add_argument(
        "--url", default=os.environ.get("POSTTRAIN_URL"), help="the studio (POSTTRAIN_URL)"
    )
    p.add_argument(
        "--token", default=os.environ.get("POSTTRAIN_TOKEN"), help="an API token (POSTTRAIN_TOKEN)"
    )
    p.add_argument(
        "--log",
        type=Path,
        help="verl's file-logger JSONL (default: VERL_FILE_LOGGER_PATH; with a command, .posttrain/metrics.jsonl, which the command is told to write)",
    )
    p.add_argument(
        "--rollout-dir",
        type=Path,
        help="trainer.rollout_data_dir (default: the command's override)",
    )
    p.add_argument(
        "--validation-dir",
        type=Path,
        help="trainer.validation_data_dir (default: the command's override)",
    )
    p.add_argument(
        "--config",
        type=Path,
        help="the run's config, YAML or JSON (default: the .hydra/config.yaml the command writes under outputs/)",
    )
    p.add_argument(
        "--name",
        help="the studio experiment the run joins (default: trainer.experiment_name, else the log's name)",
    )
    p.add_argument(
        "--total-steps",
        type=int,
        help="finish the run once this step is sent (default: trainer.total_training_steps)",
    )
    p.add_argument(
        "--state", type=Path, help="where to keep what was sent (default: beside the log)"
    )
    p.add_argument("--tag", action="append", default=[], help="a tag for the run (repeat)")
    p.add_argument(
        "--allow-cancel",
        action="store_true",
        help="let Cancel on the run's page stop the command (SIGTERM to its process group)",
    )
    p.add_argument(
        "--once",
        action="store_true",
        help="send what the files hold now, then exit (the run stays open)",
    )
    p.add_argument(
        "--end",
        choices=["succeeded", "failed", "cancelled"],
        help="with --once: then finish the run with this status",
    )
    p.add_argument(
        "--interval", type=float, default=2.0, help="seconds between looks at the files (2)"
    )
    p.add_argument(
        "--heartbeat",
        type=float,
        default=15.0,
        help="seconds between heartbeats, which also read a cancel request (15)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- and the verl command to run")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="posttrain", description=__doc__.split("\n\n")[0])
    subparsers = parser.add_subparsers(dest="what", required=True)
    watch_parser(subparsers)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    problems = []
    if not args.url:
        problems.append("set POSTTRAIN_URL (or --url) to the studio, e.g. http://studio:8000")
    if not args.token:
        problems.append("set POSTTRAIN_TOKEN (or --token) to a token made at /accounts/tokens/")
    if args.end and not args.once:
        problems.append("--end finishes the run after --once; add --once")
    if command and args.once:
        problems.append("--once sends what the files hold now; it runs no command")
    if not (
        command
        or args.log
        or args.rollout_dir
        or args.validation_dir
        or os.environ.get("VERL_FILE_LOGGER_PATH")
    ):
        problems.append(
            "name what to watch: --log, --rollout-dir, --validation-dir, or a command after --"
        )
    if problems:
        parser.error("; ".join(problems))
    logging.basicConfig(level=logging.WARNING, format="[posttrain] %(message)s")
    options = WatchOptions(
        log=args.log,
        rollout_dir=args.rollout_dir,
        validation_dir=args.validation_dir,
        config=args.config,
        name=args.name,
        state=args.state,
        total_steps=args.total_steps,
        command=command,
        allow_cancel=args.allow_cancel,
        once=args.once,
        end=args.end,
        tags=args.tag,
        interval_s=args.interval,
        heartbeat_s=args.heartbeat,
    )
    with Studio(args.url, args.token) as studio:
        watcher = Watcher(studio, options)
        signal.signal(signal.SIGTERM, watcher.forward)
        if command:
            signal.signal(signal.SIGINT, watcher.forward)
        try:
            return watcher.watch()
        except KeyboardInterrupt:
            print("[posttrain] stopped; start the same command again to go on", file=sys.stderr)
            return 130
        except (StudioError, StudioUnreachable) as exc:
            print(f"[posttrain] the studio refused: {exc}", file=sys.stderr)
            if watcher.child is None:
                return 2
            # The job goes on unreported; its output is still shown (and its pipe drained).
            print("[posttrain] the command goes on without reporting", file=sys.stderr)
            return watcher.child.process.wait()


if __name__ == "__main__":
    sys.exit(main())
