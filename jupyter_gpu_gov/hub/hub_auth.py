"""JupyterHub's ``HubOAuth`` and its handlers, for the service, without the Hub's database models
loaded until something reads them.

``jupyterhub.services.auth`` imports ``jupyterhub.scopes``, which imports ``jupyterhub.orm`` at
its top: the Hub's own tables, and ``alembic`` (with ``mako``) for their migrations, ~13 MB of
the service's resident memory for ~145 modules. ``scopes`` reads ``orm`` only inside functions
that are handed the Hub's database, and a service has none (HubAuth passes no ``db``). So
``jupyterhub.orm`` is put in place here as a lazy module (the standard library's
``importlib.util.LazyLoader``): the first attribute read of it runs it, whole and unchanged,
so nothing any caller sees differs; until then it costs nothing. HubAuth's code is JupyterHub's
own, imported as it is: the token checks are exactly theirs (docs/benchmarks-history.md, "Issue 26,
wave 30: the service's start-up")."""

from __future__ import annotations

import importlib.util
import sys


def _lazy(name: str) -> None:
    """``name`` in ``sys.modules`` (and on its package), run at its first attribute read.
    Nothing is done where it is imported already (a process that is the Hub, a test that
    imported it): that one is used as it is."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)  # imports the package, not the module
    if spec is None or spec.loader is None:
        return
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    package, _, child = name.rpartition(".")
    setattr(sys.modules[package], child, module)


# No lock: LazyLoader's first load is not thread-safe before Python 3.12.3 (a second thread
# reading the module mid-load sees it half run), but only one thread ever could read it here.
# The service reads nothing of jupyterhub.orm: JupyterHub's scopes and roles read it only with
# the Hub's database or ORM objects, which a service never passes; its token checks run on the
# event loop, and no worker thread (store, lease, DCGM, training, listings) imports JupyterHub
# (this module is the service's only import of it: tests/test_architecture.py). Something that
# must read it from a thread should import it before the threads start.
_lazy("jupyterhub.orm")

from jupyterhub.services import auth as hub_auth_module  # noqa: E402  (after _lazy)
from jupyterhub.services.auth import (  # noqa: E402
    HubOAuth,
    HubOAuthCallbackHandler,
    HubOAuthenticated,
    UserNotAllowed,
)

__all__ = [
    "HubOAuth",
    "HubOAuthCallbackHandler",
    "HubOAuthenticated",
    "UserNotAllowed",
    "hub_auth_module",
]
