"""Speed-ups of JupyterHub's ``HubOAuth`` for the service's handlers, kept apart from them:
the answer to "who sent this request", once ``prepare`` has asked the Hub, without a second
trip through HubAuth's thread, and the scope check answered at once when the caller holds a
required scope as it is written (the savings: docs/benchmarks.md, "Report ingest over HTTP" and
"Issue 26, wave 7"). The plain path is ``HubOAuth`` and ``HubOAuthenticated`` themselves;
tests/test_governor_hub.py and tests/test_prepared_auth.py check both answer alike."""

from __future__ import annotations

from jupyterhub.services.auth import HubOAuth, HubOAuthenticated


class PreparedHubOAuth(HubOAuth):
    """``HubOAuth`` whose synchronous ``get_user`` answers from the handler once ``prepare``
    has asked: HubAuth's synchronous path hops to its own thread and back on every request,
    even for the answer already kept on the handler (``_cached_hub_user``, where
    ``HubAuth._get_user`` keeps it and looks first). Anything else takes HubOAuth's path."""

    def get_user(self, handler, *, sync=True):
        if sync and hasattr(handler, "_cached_hub_user"):
            return handler._cached_hub_user
        return super().get_user(handler, sync=sync)


class PreparedHubAuthenticated(HubOAuthenticated):
    """``HubOAuthenticated`` with ``PreparedHubOAuth``, whose scope check takes a short path
    for the common case: a caller whose scopes hold one of the required ones (the service's
    access scope) exactly as written is allowed, which is what ``check_scopes`` answers for
    it, without expanding every scope's filters and formatting its debug lines anew for each
    request (a server's token is checked on every report). Every other caller (a filtered or
    broader scope, or none) takes HubOAuthenticated's full check, refusals included."""

    hub_auth_class = PreparedHubOAuth

    def check_hub_user(self, model):
        required = self.hub_scopes
        if required and not required.isdisjoint(model.get("scopes") or ()):
            model.setdefault("kind", "user")
            return model
        return super().check_hub_user(model)
