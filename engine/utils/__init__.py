"""Names that verl tutorials import (``engine.utils.config``, ``engine.utils.device``).

The engine's own modules are ``engine.config`` and ``engine.device_info``; these re-export what
the tutorials call, under the tutorials' names, so a snippet runs with ``verl`` renamed.
"""
