"""``jupyterhub_config.py`` is Python, and admins set things anywhere in it: what
``add_governor`` and ``add_gpu_profiles`` add to ``c`` is added again to the Hub's whole
configuration once the Hub has read it, so a line after the call (a ``pre_spawn_hook``, the
``services`` or ``extra_handlers`` list, an interval) does not silently replace it.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable

from traitlets.config import LazyConfigValue


def again_on_the_whole_config(add: Callable[[object], None]) -> None:
    """Run ``add`` again on everything the Hub loading this file read (its config files, then
    its command line), before it applies it. traitlets' ``Application.load_config_file`` hands
    all of it to ``update_config``; that Hub's is wrapped for that one call. Outside a Hub's
    ``load_config_file`` (a test's ``Config()``, the governor loading the same file) nothing is
    done."""
    app = _hub_loading_the_file()
    if app is None:
        return
    original = app.update_config  # the Hub's own, or an earlier call's wrapper
    wrapped = vars(app).get("update_config")

    def update_config(config):
        # Once: later updates are the Hub's own business, through its class's method again.
        if wrapped is None:
            del app.update_config
        else:
            app.update_config = wrapped
        add(config)
        return original(config)

    app.update_config = update_config


def _hub_loading_the_file():
    """The ``JupyterHub`` whose ``load_config_file`` runs this file, or None. Not always the
    singleton: ``jupyterhub token`` and ``upgrade-db`` load it into a Hub of their own (left
    without the re-add, ``token`` deleted the governor's roles that a later ``load_roles``
    line dropped, from the running Hub's database)."""
    hub = getattr(sys.modules.get("jupyterhub.app"), "JupyterHub", None)  # loaded by the Hub
    frame = inspect.currentframe() if hub is not None else None
    while frame is not None:
        if frame.f_code.co_name == "load_config_file":
            app = frame.f_locals.get("self")
            if isinstance(app, hub):
                return app
        frame = frame.f_back
    return None


def listed(value) -> list:
    """The items of a list setting as ``c`` holds it: a list, or traitlets' lazy value that
    ``c.X.y.append``/``extend``/``prepend``/``insert`` made (read without ``get_value``, which
    would keep the result and drop later appends)."""
    if isinstance(value, LazyConfigValue):
        return [*value._prepend, *(item for _, item in value._inserts), *value._extend]
    return list(value or ())


def updated(value: LazyConfigValue) -> dict:
    """What ``c.X.y.update(...)`` has set so far on a dict setting traitlets holds lazily."""
    pending = value._update
    return pending if isinstance(pending, dict) else {}
