"""The service checks tokens with JupyterHub's own HubOAuth without loading the Hub's database
models (``hub/hub_auth.py``: ~13 MB of its memory), and those models are whole when read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent

# A fresh interpreter: the service's modules, token checks against a Hub (the fake, over real
# HTTP), the scope checks HubOAuthenticated makes, then a read of ``jupyterhub.orm``; with
# ``eager``, the Hub's models loaded first, as JupyterHub's imports load them.
SCRIPT = """
import asyncio, json, sys

if sys.argv[1:] == ["eager"]:
    import jupyterhub.orm  # as before hub_auth.py: loaded with HubOAuth

import jupyter_gpu_gov.hub.app  # the service, all its modules
from jupyter_gpu_gov.hub.hub_auth import hub_auth_module
from jupyter_gpu_gov.hub.prepared_auth import PreparedHubOAuth
from fake_hub_api import FakeHub

SERVICE_ACCESS = "access:services!service=gpu-gov"
ACCESS = {"access:services", SERVICE_ACCESS}


async def main():
    out = {"alembic_at_start": "alembic" in sys.modules}
    async with FakeHub() as hub:
        hub.add_user_token("ann", "ann-token", extra_scopes=[SERVICE_ACCESS])
        hub.add_user_token("bob", "bob-token", extra_scopes=["access:services!user=bob"])
        hub.add_user_token("eve", "eve-token")
        auth = PreparedHubOAuth(api_token=hub.token, api_url=hub.api_url, access_scopes=ACCESS)
        for name in ("ann", "bob", "eve"):
            model = await auth.user_for_token(f"{name}-token", sync=False)
            out[name] = [model["name"], sorted(hub_auth_module.check_scopes(ACCESS, model["scopes"]))]
        out["unknown"] = await auth.user_for_token("no-such-token", sync=False)
    out["alembic_after_checks"] = "alembic" in sys.modules
    import jupyterhub.orm
    out["orm_user_table"] = jupyterhub.orm.User.__tablename__
    out["alembic_after_read"] = "alembic" in sys.modules
    print(json.dumps(out))


asyncio.run(main())
"""


def _run(*args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_token_checks_answer_without_the_hubs_database_models_loaded():
    out = _run()
    # JupyterHub's ORM (and alembic under it) is not loaded by the service's imports nor by
    # its token checks: the memory they held is not spent.
    assert out["alembic_at_start"] is False
    assert out["alembic_after_checks"] is False
    # The owner and the access scopes that match; a token without access has none; an unknown
    # token is nobody.
    assert out["ann"] == ["ann", ["access:services!service=gpu-gov"]]
    assert out["eve"] == ["eve", []]
    assert out["unknown"] is None
    # Read at last, the module is JupyterHub's whole: its tables, alembic with them.
    assert out["orm_user_table"] == "users"
    assert out["alembic_after_read"] is True
    # Every answer is the one given with the models loaded first, as before.
    eager = _run("eager")
    assert eager["alembic_at_start"] is True
    loaded = ("alembic_at_start", "alembic_after_checks")
    assert {k: v for k, v in out.items() if k not in loaded} == {
        k: v for k, v in eager.items() if k not in loaded
    }
