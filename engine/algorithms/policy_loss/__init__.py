"""Policy losses, one module per loss family, registered by ``actor.policy_loss.loss_mode``.

Importing anything from the package imports every module in it, so the registry
(``base.get_policy_loss_fn``) holds every loss.
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
