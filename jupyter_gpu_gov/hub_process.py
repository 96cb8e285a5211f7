"""What both layers' ``hubconfig`` (``hub/hubconfig.py``, ``profiles/hubconfig.py``) do to the
JupyterHub that loads ``jupyterhub_config.py``: adapter code, run in the Hub's process, that
knows JupyterHub's application and its ORM (``core/config_order.py`` keeps the pure part: what
``c`` holds). JupyterHub is never imported here: its modules are looked up where the Hub has
loaded them, so the governor service, which loads the same ``hubconfig``, does not load
JupyterHub's ORM for them (``tests/test_architecture.py``).

What ``add_governor`` and ``add_gpu_profiles`` add to ``c`` is added again to the Hub's whole
configuration once the Hub has read it (``again_on_the_whole_config``), so a line after the
call (a ``pre_spawn_hook``, the ``services`` or ``extra_handlers`` list, an interval) does not
silently replace it. And the Hub runs an admin's own hooks of a spawn in its own order, after
it saved what the user sent: ``user_options`` are bounded where the Hub stores them
(``bound_where_stored``), not in a hook.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable

from .core.grant import oversized

# Why the options last written to a spawner's row were cut, and the server row they were
# written under: an attribute of the row's Python object, never saved.
_CUT = "_gpu_gov_cut"


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


def bound_where_stored() -> None:
    """In the Hub's process (``jupyterhub.orm`` loaded; elsewhere nothing is done), cut every
    ``user_options`` written to a spawner's row to what ``grant.oversized`` keeps, as it is
    written. JupyterHub saves a spawn's options before any hook of the spawn runs
    (``User.spawn``: the row, then the Authenticator's ``pre_spawn_start``, the
    ``auth_state_hook``, ``apply_user_options``, the ``pre_spawn_hook``, ``start``), and
    JupyterHub 6 saves them with no spawn (a named server's ``PUT`` and ``PATCH``): a guard in
    a hook came after an admin's refusal in an earlier one, which left them saved. Idempotent."""
    orm = sys.modules.get("jupyterhub.orm")
    event = sys.modules.get("sqlalchemy.event")
    if orm is None or event is None:
        return
    if not event.contains(orm.Spawner.user_options, "set", _bounded):
        event.listen(orm.Spawner.user_options, "set", _bounded, retval=True)


def _bounded(row, value, _old, _initiator):
    why = None
    if isinstance(value, dict):
        kept, why = oversized(value)
        if why:
            # In place: the Hub hands the same dict to the spawner, whose user_options its
            # REST API lists (a refused spawner stays in memory, stopped servers listed).
            value.clear()
            value.update(kept)
    # The server the spawn under way runs in: a later spawn (a new server) is not refused.
    setattr(row, _CUT, (row.server, why) if why else None)
    return value


def cut_where_stored(row) -> str | None:
    """Why the options of the spawn under way on this spawner's row were cut where the Hub
    stored them (``bound_where_stored``), or None: that spawn is refused, naming it."""
    noted = getattr(row, _CUT, None) if row is not None else None
    if noted is None:
        return None
    server, why = noted
    return why if server is not None and server is row.server else None
