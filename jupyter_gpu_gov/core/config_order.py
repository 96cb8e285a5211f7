"""``jupyterhub_config.py`` is Python, and admins set things anywhere in it: what
``add_governor`` and ``add_gpu_profiles`` add to ``c`` is added again to the Hub's whole
configuration once the Hub has read it, so a line after the call (a ``pre_spawn_hook``, the
``services`` or ``extra_handlers`` list, an interval) does not silently replace it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


def again_on_the_whole_config(add: Callable[[object], None]) -> None:
    """Run ``add`` again on everything the starting Hub read (its config files, then its command
    line), before it applies it. traitlets' ``Application.load_config_file`` hands all of it to
    ``update_config``; the running Hub's is wrapped for that one call. Outside a Hub starting
    up (a test's ``Config()``, the governor loading the same file) nothing is done."""
    app_module = sys.modules.get("jupyterhub.app")  # loaded by the Hub running the file
    hub = getattr(app_module, "JupyterHub", None)
    if hub is None or not hub.initialized():
        return
    app = hub.instance()
    original = app.update_config  # the Hub's own, or an earlier call's wrapper

    def update_config(config):
        app.update_config = original  # once: later updates are the Hub's own business
        add(config)
        return original(config)

    app.update_config = update_config
