"""The ``tiny://`` URIs a path key may name, in one torch-free place the config validator reads.

``engine.tools.tiny_uris`` resolves them to local paths, building the asset on first use: the
embedded model, data and reward model (``engine.tiny``) and the tool tasks: the calculator task
(``tiny://calculator/<name>``, ``engine.tools.tiny_task``) and the interpreter task
(``tiny://interpreter/<name>``, ``engine.tools.tiny_interpreter_task``).
"""

TINY_PREFIX = "tiny://"
CALCULATOR_PREFIX = TINY_PREFIX + "calculator/"
INTERPRETER_PREFIX = TINY_PREFIX + "interpreter/"
# URI name -> path inside the folder a tool task's build returns (every tool task has the same).
TOOL_TASK_FILES = {
    "model": "model",
    "train.parquet": "data/train.parquet",
    "val.parquet": "data/val.parquet",
    "tools.yaml": "tools.yaml",
}
CALCULATOR_URIS = tuple(CALCULATOR_PREFIX + name for name in TOOL_TASK_FILES)
INTERPRETER_URIS = tuple(INTERPRETER_PREFIX + name for name in TOOL_TASK_FILES)
# engine.tiny's URIs (URI_FIELDS, then REWARD_MODEL_URI), listed again so that the config
# validator knows them without importing engine.tiny, which imports torch (engine.tiny does not
# import them from here: an edit of its sources rebuilds its cache). A test checks they agree.
EMBEDDED_NAMES = (
    "model",
    "train.parquet",
    "val.parquet",
    "train.jsonl",
    "val.jsonl",
    "reward_model",
)
EMBEDDED_URIS = tuple(TINY_PREFIX + name for name in EMBEDDED_NAMES)
TINY_URIS = (*EMBEDDED_URIS, *CALCULATOR_URIS, *INTERPRETER_URIS)
