"""A speed-up of JupyterHub's ``HubOAuth`` for the service's handlers, kept apart from them:
the answer to "who sent this request", once ``prepare`` has asked the Hub, without a second
trip through HubAuth's thread (the saving: docs/benchmarks.md, "Report ingest over HTTP").
The plain path is ``HubOAuth`` itself; tests/test_governor_hub.py checks both answer alike."""

from __future__ import annotations

from jupyterhub.services.auth import HubOAuth


class PreparedHubOAuth(HubOAuth):
    """``HubOAuth`` whose synchronous ``get_user`` answers from the handler once ``prepare``
    has asked: HubAuth's synchronous path hops to its own thread and back on every request,
    even for the answer already kept on the handler (``_cached_hub_user``, where
    ``HubAuth._get_user`` keeps it and looks first). Anything else takes HubOAuth's path."""

    def get_user(self, handler, *, sync=True):
        if sync and hasattr(handler, "_cached_hub_user"):
            return handler._cached_hub_user
        return super().get_user(handler, sync=sync)
