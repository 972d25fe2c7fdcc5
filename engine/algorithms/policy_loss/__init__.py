"""Policy losses, one module per loss family, registered by ``actor.policy_loss.loss_mode``.

Why this shape: adding a loss should touch its own module and its test, nothing else. So

- a loss registers itself with ``@register_policy_loss("name")`` beside its code (verl's
  decorator), and the config's choices (``engine.algorithms.names.POLICY_LOSS_MODES``) are read
  from those decorators in this folder's source, without importing torch;
- every loss has one call, ``fn(inputs, config)`` (``base``): the micro-batch's tensors, its
  aggregation and global batch in :class:`~engine.algorithms.policy_loss.base.PolicyLossInputs`,
  and the actor's config section, from which the loss reads the keys it names, so the actor
  calls whatever ``get_policy_loss_fn(loss_mode)`` returns with no branch per mode;
- this file imports every module of the package, so anything imported from it (``base``
  included) sees the registry full, and no list of modules is kept by hand.

A loss that needs a new key also adds it to the actor's config section (``engine.config``).
Each module's docstring names its paper; ``bypass_mode`` is verl's rollout correction applied
inside the loss.
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
