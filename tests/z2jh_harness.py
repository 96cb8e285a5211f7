"""The Zero to JupyterHub chart's hub configuration, run as the chart runs it, for tests.

``tests/data/z2jh/`` holds the chart's own ``jupyterhub_config.py``, ``z2jh.py`` and default
``values.yaml`` (see SOURCES.md there). ``render(root, values)`` lays out what the chart's
templates give the hub pod, under ``root`` instead of ``/usr/local/etc/jupyterhub`` (the only
change made to the chart's files: that path):

- ``secret/values.yaml``: the chart's defaults merged with ``values`` (maps merged key by key,
  anything else replaced, as Helm merges ``-f`` files), plus ``Chart`` and ``Release``;
- ``secret/hub.config.*``: the generated cookie secret, CryptKeeper keys and proxy token;
- ``secret/hub.services.<key>.apiToken``: each ``hub.services`` entry's token (its
  ``apiToken``, or one generated, as the chart's Secret ``hub`` holds it);
- ``config/<name>``: the resource names (``hub``, ``proxy-api``, ...) of the name templates;
- every ``hub.extraFiles`` entry's ``stringData`` at its ``mountPath``;
- ``jupyterhub_config.py`` and ``z2jh.py``.

The chart's file then does what it does in the hub pod: sets KubeSpawner from ``singleuser.*``
(``profile_list`` from ``singleuser.profileList`` among them), the services, ``hub.config``,
runs ``jupyterhub_config.d/*.py``, then the ``hub.extraConfig`` entries in key order.
``hub_env(values)`` is the hub container's environment (``hub.extraEnv`` and the Service
variables Kubernetes sets).
"""

from __future__ import annotations

import copy
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parent / "data" / "z2jh"
REPO = CHART.parents[2]
MOUNT = "/usr/local/etc/jupyterhub"
RELEASE = "jhub"
NAMES = ("hub", "proxy-api", "proxy-public", "user-scheduler", "priority", "singleuser",
         "image-pull-secret", "proxy")  # fmt: skip


def merge(base: Any, override: Any) -> Any:
    """Helm's merge of a values file over the chart's defaults."""
    if isinstance(base, Mapping) and isinstance(override, Mapping):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = merge(base.get(key), value) if key in base else copy.deepcopy(value)
        return merged
    return copy.deepcopy(override)


def load_values(*files: str | os.PathLike | Mapping) -> dict:
    """The chart's defaults with each values file (a path, or a dict) merged over them."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for each in files:
        layer = each if isinstance(each, Mapping) else yaml.safe_load(Path(each).read_text())
        values = merge(values, layer or {})
    return values


def set_file(values: dict, key: str, path: str | os.PathLike) -> dict:
    """``helm --set-file key=path``."""
    node = values
    *parents, last = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = Path(path).read_text()
    return values


def render(root: str | os.PathLike, values: Mapping, namespace: str = "default") -> Path:
    """Lay out the hub pod's configuration under ``root``; return its jupyterhub_config.py."""
    root = Path(root)
    for folder in ("config", "secret", "jupyterhub_config.d"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    for name in ("jupyterhub_config.py", "z2jh.py"):
        text = (CHART / name).read_text().replace(MOUNT, str(root))
        (root / name).write_text(text)
    for name in NAMES:
        (root / "config" / name).write_text(name)
    rendered = dict(values)
    rendered["Chart"] = {"Name": "jupyterhub", "Version": "4.4.0", "AppVersion": "5.5.0"}
    rendered["Release"] = {"Name": RELEASE, "Namespace": namespace, "Service": "Helm"}
    (root / "secret" / "values.yaml").write_text(yaml.safe_dump(rendered))
    for key in ("JupyterHub.cookie_secret", "CryptKeeper.keys", "ConfigurableHTTPProxy.auth_token"):
        (root / "secret" / f"hub.config.{key}").write_text(secrets.token_hex(32))
    for key, service in (values.get("hub", {}).get("services") or {}).items():
        token = service.get("apiToken") or service.get("api_token") or secrets.token_hex(32)
        (root / "secret" / f"hub.services.{key}.apiToken").write_text(token)
    for details in (values.get("hub", {}).get("extraFiles") or {}).values():
        target = Path(details["mountPath"].replace(MOUNT, str(root)))
        if not target.is_relative_to(root):
            raise ValueError(f"extraFiles mountPath {details['mountPath']} is outside {MOUNT}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(details["stringData"])
    return root / "jupyterhub_config.py"


def hub_env(
    values: Mapping,
    root: str | os.PathLike,
    namespace: str = "default",
    ports: Mapping[str, int] = (),
) -> dict:
    """The hub container's environment: ``hub.extraEnv`` (plain values; paths under the mount
    moved to ``root`` as ``render`` moves the files), the namespace, and the
    ``<SERVICE>_SERVICE_PORT`` variables Kubernetes sets for the chart's Services."""
    env = {"POD_NAMESPACE": namespace, "HELM_RELEASE_NAME": RELEASE, "PYTHONUNBUFFERED": "1"}
    for name, port in dict(ports).items():
        env[f"{name.upper().replace('-', '_')}_SERVICE_PORT"] = str(port)
    for name, value in (values.get("hub", {}).get("extraEnv") or {}).items():
        if isinstance(value, str):
            env[name] = value.replace(MOUNT, str(root))
    return env


def load(root: str | os.PathLike, values: Mapping, env: Mapping[str, str]):
    """Run the chart's jupyterhub_config.py (laid out by ``render``) in this process, as the hub
    would, and return the traitlets ``Config`` it leaves. ``env``: the hub's environment, set
    while it runs."""
    import sys

    from tornado.httpclient import AsyncHTTPClient
    from traitlets.config import PyFileConfigLoader

    path = render(root, values)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    sys.modules.pop("z2jh", None)  # the chart's helpers cache the values they read
    try:
        return PyFileConfigLoader(path.name, path=str(path.parent)).load_config()
    finally:
        AsyncHTTPClient.configure(None)  # the chart picks curl for the hub; not for the tests
        sys.modules.pop("z2jh", None)
        while str(path.parent) in sys.path:
            sys.path.remove(str(path.parent))
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def as_extra_config(harness_config: str) -> str:
    """The test harness's own config text as a ``hub.extraConfig`` entry: the chart's
    ``get_config`` is z2jh's (key, default), so the entry uses the chart's ``c`` instead."""
    return harness_config.replace("c = get_config()  # noqa: F821", "pass  # the chart's c")
