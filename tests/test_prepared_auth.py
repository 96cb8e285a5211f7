"""The scope check's short path (``hub/prepared_auth.py``) allows and refuses exactly whom
JupyterHub's own ``HubOAuthenticated.check_hub_user`` allows and refuses."""

from __future__ import annotations

import pytest
from jupyterhub.services.auth import HubOAuth, HubOAuthenticated, UserNotAllowed

from jupyter_gpu_gov.hub.prepared_auth import PreparedHubAuthenticated

ACCESS = {"access:services", "access:services!service=gpu-gov"}  # what the Hub sets for us

CALLERS = {
    "a server's token": ["access:services!service=gpu-gov", "users:activity!user=ann"],
    "any service's access": ["access:services", "read:users!user=ann"],
    "another service's access": ["access:services!service=other", "access:servers!user=ann"],
    "a filter the check must expand": ["access:services!user=ann"],
    "a look-alike": ["access:services!service=gpu-gov-x", "access:services!service=gpu"],
    "no scopes": [],
}


def _check(handler_class: type, model: dict) -> dict | str:
    handler = handler_class.__new__(handler_class)
    handler.hub_auth = HubOAuth(
        api_token="secret", api_url="http://127.0.0.1:9/hub/api", access_scopes=ACCESS
    )
    try:
        return handler.check_hub_user(model)
    except UserNotAllowed:
        return "refused"


@pytest.mark.parametrize("caller", CALLERS)
def test_the_short_path_answers_as_hub_oauthenticated_does(caller):
    model = {"name": "ann", "scopes": CALLERS[caller]}
    plain = _check(HubOAuthenticated, dict(model))
    short = _check(PreparedHubAuthenticated, dict(model))
    assert short == plain
    expected = "allowed" if caller in ("a server's token", "any service's access") else "refused"
    assert ("refused" if plain == "refused" else "allowed") == expected
    if plain != "refused":
        assert short["kind"] == "user"
