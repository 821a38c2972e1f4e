"""Inspect entry point (``[project.entry-points.inspect_ai] denv = "denv._inspect_registry"``).

Importing this module registers the ``denv`` sandbox environment with Inspect.
"""

from denv.inspect import DenvSandbox, DenvSandboxConfig  # noqa: F401  (registers "denv")
