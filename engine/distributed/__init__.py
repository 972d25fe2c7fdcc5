"""The distributed engine: Ray worker groups of FSDP2-sharded workers, one Ray actor per rank.

The single-process trainer's worker classes are reused as they are. ``rank_worker`` wraps
``ActorRolloutRefWorker`` / ``CriticWorker`` / ``RewardModelScorer`` on each rank with FSDP2
(``fsdp``) inside a process group (``process_group``); ``worker_group`` gives the controller
proxies with the same method names that split batches across ranks, and calls the ranks' roles
over a direct connection to each rank (``channel``). The controller that builds those proxies
instead of local workers is ``engine.trainer.ray_trainer.RayPPOTrainer``, above this package:
nothing here imports ``engine.trainer``. Importing this package does not import Ray.
"""
