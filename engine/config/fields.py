"""What every config section is made of: the field helpers, the limits, the errors.

A section is a dataclass whose fields are made by ``_f`` (an honoured key), ``_inert`` (a key of
machinery this engine does not run: accepted, warned about when set) or ``_refused`` (a feature
this engine does not have: only the default is accepted), ``_section`` (a nested section) and
``_runtime`` (a Python-only object). Field metadata carries everything the CLI, the validator and
the web form need: ``help`` (every field), ``choices`` (valid string values),
``gt``/``ge``/``lt``/``le`` (bounds of a number; a count's maximum is a ``Limit`` that says why:
what the database or the engine holds), ``resource`` (what a string names: a path, code, a module
or a server setting), ``basic`` (shown outside the form's advanced section), ``effect`` (honoured,
no effect or refused, with ``why``), ``follows`` (the key a derived key copies) and ``runtime``
(Python-only objects, never serialised or shown in the form).
"""

import copy
import difflib
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


class Limit(int):
    """An upper bound of a count that carries why it exists, for the validator's message."""

    why: str

    def __new__(cls, value: int, why: str) -> "Limit":
        limit = super().__new__(cls, value)
        limit.why = why
        return limit


# The largest counts a config may ask for, so that a run never fails at its start (or hours in)
# on a number the database or the engine cannot hold: steps, indices and lengths are PostgreSQL
# ``integer`` columns (a run's total and latest step, each sample's step, index and length).
MAX_STEPS = Limit(2**31 - 1, "step numbers are stored as 32-bit integers")
MAX_EPOCHS = Limit(1_000_000, "epochs times batches per epoch is the step count, a 32-bit integer")
MAX_TOKENS = Limit(2**20, "the longest prompt or response the engine allocates for")
MAX_TOKEN_BUDGET = Limit(2**24, "the most tokens one micro-batch or sequence holds")
MAX_BATCH = Limit(2**20, "the most prompts or samples one batch holds")
MAX_WORKERS = Limit(1024, "the most processes of one kind a run starts")
# What a string field names, for the studio's rules on a shared server (webapp.experiments.configs):
#   path    a file or folder the run reads (data, model, tokenizer, checkpoint to resume from)
#   code    a Python file whose code the run executes
#   module  a Python module the run imports by name
#   server  a setting of the machine the run uses (a folder it writes, a cluster address)
#   endpoint  a reward service the run posts to: only an entry of the administrator's
#             POSTTRAIN_REWARD_ENDPOINTS (engine.rewards.endpoints), checked by the validator
RESOURCES = ("path", "code", "module", "server", "endpoint")
# What a key does here, each key exactly one (docs/config.md lists them in three tables):
#   honoured   it changes what the engine does
#   no effect  a speed or infrastructure knob of an engine this one does not run; setting it
#              prints one warning line naming every such key that was set
#   refused    a feature this engine does not have; any value but the default is an error that
#              says what to do instead (``why``)
HONOURED, NO_EFFECT, REFUSED = "honoured", "no effect", "refused"
EFFECTS = (HONOURED, NO_EFFECT, REFUSED)


class ConfigError(ValueError):
    """A configuration could not be loaded or is invalid."""


class ConfigFieldError(ConfigError):
    """One problem with one key: what is wrong and how to fix it."""

    def __init__(self, key: str, value: Any, message: str) -> None:
        self.key, self.value, self.message = key, value, message
        super().__init__(f"{key}={value!r}: {message}" if key else message)


class ConfigValidationError(ConfigError):
    """Every problem ``validate_config`` found, each a ``ConfigFieldError``."""

    def __init__(self, errors: list[ConfigFieldError], warnings: list[str] | None = None) -> None:
        self.errors, self.warnings = list(errors), list(warnings or [])
        self.config: Any = None  # the config without the bad values, where a loader built one
        lines = "\n".join(f"  {error}" for error in self.errors)
        super().__init__(f"{len(self.errors)} configuration error(s):\n{lines}")


def resolved(value: T | None, key: str) -> T:
    """Return the value of ``key``, one that ``resolve_config`` fills in (verl interpolates it) or
    ``validate_config`` requires; raise ConfigFieldError naming the key where it is still null.

    The engine reads such keys from a resolved, validated config, so this only fails for a config
    used without ``resolve_config`` and ``validate_config`` (as ``PPOTrainer`` calls them).
    """
    if value is None:
        raise ConfigFieldError(
            key,
            None,
            "is null where a value is needed; set it, or pass the config through resolve_config "
            "and validate_config (PPOTrainer does) to fill it in from the key it follows",
        )
    return value


@dataclass
class Validation:
    """What the rules of a section read, in one ``validate_config`` call.

    ``cfg`` is the resolved copy of the ``PPOConfig`` (``resolve_config``: a key left null holds
    the value it takes), ``given`` the config as it was given (that key still null); ``check_files``
    says whether the files and folders a key names must exist. A rule returns its errors and
    appends what is only worth a warning to ``warnings``. The two configs are typed ``Any`` here:
    the sections sit below the root that holds them, so a rule types its own section's part.
    """

    cfg: Any
    given: Any
    check_files: bool = True
    warnings: list[str] = field(default_factory=list)


# Hints for attributes a section does not have, by (section class, name): the tutorial spellings
# that engine.config.aliases could not turn into a property of that section.
ATTRIBUTE_HINTS: dict[tuple[type, str], str] = {}


class _Section:
    """A config section: setting an attribute that is not one of its keys is an error.

    A dataclass would keep ``config.trainer.total_step = 5`` as a new attribute that nothing
    reads; a run would then ignore it without a word.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        cls = type(self)
        if name not in cls.__dataclass_fields__ and not isinstance(  # type: ignore[attr-defined]
            getattr(cls, name, None), property
        ):
            hint = ATTRIBUTE_HINTS.get((cls, name))
            if hint is None:
                keys = list(cls.__dataclass_fields__)  # type: ignore[attr-defined]
                close = difflib.get_close_matches(name, keys, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                hint += f"its keys: {', '.join(keys)}"
            raise AttributeError(f"{cls.__name__} has no key {name!r}; {hint}")
        object.__setattr__(self, name, value)


_MULTIMODAL = "multimodal data is not supported; use a text-only dataset"
_NO_ULYSSES = (
    "the reward model's forward is not split over ranks (Ulysses sequence parallelism runs for "
    "the policy, the reference and the critic); keep 1 and lower the sequence length or raise "
    "the number of ranks"
)
_ULYSSES_ENGINE_COPY = (
    "this is verl's new-engine copy of the role's key; set the role's own "
    "ulysses_sequence_parallel_size (actor_rollout_ref.actor., actor_rollout_ref.ref. or critic.) "
    "and keep 1 here"
)


_TIMES_DP_HELP = (
    "The engine's own: multiply seq-mean-token-sum-norm by the data-parallel size, as the other "
    "loss_agg_modes are. FSDP averages gradients over ranks, so without it (verl's agg_loss) the "
    "gradient is the mean of the ranks' token sums and halves from one rank to two; with it the "
    "gradient is the mini-batch's sum, the same at any rank count (Dr. GRPO's intent)."
)


def _f(
    default: Any,
    help: str,
    *,
    choices: tuple[str, ...] | None = None,
    basic: bool = False,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    resource: str | None = None,
    effect: str = HONOURED,
    why: str | None = None,
    follows: str | None = None,
) -> Any:
    """Return a field with help text; mutable defaults are copied per instance.

    ``gt``, ``ge``, ``lt`` and ``le`` bound a number (``> gt``, ``>= ge``, ...; None passes):
    the validator checks them and the form gives its input ``min`` and ``max``. ``resource``
    says what a string names (one of ``RESOURCES``: path, code, module, server, endpoint). ``effect`` is
    one of ``EFFECTS``; a refused key says ``why`` (what is missing, what to do instead).
    ``follows`` names the key a derived key copies in verl (``actor.rollout_n`` follows
    ``rollout.n``): null takes that value, and any other value must equal it.
    """
    if resource is not None and resource not in RESOURCES:
        raise ValueError(f"resource={resource!r}: must be one of {', '.join(RESOURCES)}")
    if effect not in EFFECTS:
        raise ValueError(f"effect={effect!r}: must be one of {', '.join(EFFECTS)}")
    if (effect == REFUSED) != bool(why):
        raise ValueError("a refused key says why (and only a refused key has a why)")
    metadata = {
        "help": help,
        "choices": choices,
        "basic": basic,
        "gt": gt,
        "ge": ge,
        "lt": lt,
        "le": le,
        "resource": resource,
        "effect": effect,
        "why": why,
        "follows": follows,
    }
    if isinstance(default, list | dict):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def _inert(default: Any, help: str, **kwargs: Any) -> Any:
    """Return a no-effect field: accepted so verl's files load, warned about when set."""
    return _f(default, help, effect=NO_EFFECT, **kwargs)


def _refused(default: Any, help: str, why: str, **kwargs: Any) -> Any:
    """Return a refused field: only its default is accepted; ``why`` says what to do instead."""
    return _f(default, help, effect=REFUSED, why=why, **kwargs)


def _target(class_path: str) -> Any:
    """Return verl's ``_target_`` of a section: the class verl builds from it, kept as is."""
    return _refused(
        class_path,
        "verl's config class for this section.",
        "the engine builds its own config objects and loads no class named here; keep verl's "
        "value or leave the key out",
    )


def _global_micro_batch(forward: str, per_gpu: str) -> Any:
    """Return verl's deprecated global micro-batch size of one ``forward`` of a role, which the
    data-parallel size divides into its ``per_gpu`` key."""
    return _f(
        None,
        f"Samples per {forward} over all GPUs (verl's deprecated global size): divided by the "
        f"data-parallel size into {per_gpu}.",
        gt=0,
        le=MAX_BATCH,
    )


def _rollout_n() -> Any:
    """Return verl's ``rollout_n`` of a role: derived from ``rollout.n``, never set on its own."""
    return _refused(
        None,
        "Responses per prompt; null: rollout.n.",
        "it is derived from actor_rollout_ref.rollout.n; set that",
        follows="actor_rollout_ref.rollout.n",
    )


def _sequence_parallel(role: str) -> Any:
    """Return the ``ulysses_sequence_parallel_size`` of a role the engine splits (``role``: its
    model section's key prefix, e.g. ``actor_rollout_ref.model``)."""
    return _f(
        1,
        "Ulysses sequence parallel size: ranks that split each packed micro-batch along the "
        "sequence (an all-to-all over the attention heads around attention, as verl); the "
        f"data-parallel size becomes ranks / this. Needs {role}.use_remove_padding=True and a "
        "divisor of the ranks and of the model's attention heads.",
        ge=1,
    )


def _ulysses(why: str = _NO_ULYSSES) -> Any:
    """Return an ``ulysses_sequence_parallel_size`` the engine does not honour: only 1."""
    return _refused(1, "Ulysses sequence parallel size.", why)


def _section(factory: Any, help: str, *, bounds_when: str | None = None) -> Any:
    """Return a field holding a nested section.

    ``bounds_when`` names a key (``critic.enable``): the section's ``gt``/``ge``/``lt``/``le``
    bounds are checked only when its resolved value is true.
    """
    metadata = {"help": help, "bounds_when": bounds_when} if bounds_when else {"help": help}
    return field(default_factory=factory, metadata=metadata)


def _runtime(help: str) -> Any:
    """Return a Python-only field: not compared, not serialised, not in the form."""
    return field(default=None, compare=False, repr=False, metadata={"help": help, "runtime": True})
