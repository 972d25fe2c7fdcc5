"""A small Python client of the PostTrain Studio REST API (``/api/``, docs/api.md).

    from posttrain_client import Studio

    studio = Studio("http://127.0.0.1:8000", token="pts_...")
    experiment = studio.experiments.create(config, name="tiny grpo")
    run = experiment.launch()
    run.wait(timeout=600)
    run.metrics()          # a pandas DataFrame, one row per step
    run.samples(step=1)    # the step's samples, as dicts

A run the studio did not launch reports itself through ``ExternalRun`` (``posttrain watch``
streams a verl run's files, ``posttrain_client.trl.PostTrainCallback`` a TRL run).

Every error the server answers raises ``StudioError`` with its status, its messages and the
field errors keyed as the server keys them (``data.train_batch_size``).
"""

from posttrain_client.client import Dataset, Experiment, Run, Studio, StudioError
from posttrain_client.external import ExternalRun, StudioUnreachable

__version__ = "0.2.0"
__all__ = [
    "Dataset",
    "Experiment",
    "ExternalRun",
    "Run",
    "Studio",
    "StudioError",
    "StudioUnreachable",
]
