"""Pods the hub's stop could not delete: found, audited, deleted.

A server's stop deletes its pod, tried again within KubeSpawner's
``k8s_api_request_retry_timeout`` (``GpuKubeSpawner._make_delete_pod_request``). When the
Kubernetes API fails longer, JupyterHub records the server stopped all the same (``User.stop``)
with its pod running and holding its GPU, for nobody to delete. ``GpuKubeSpawner.stop`` then
records the pod in the spawner's state (``LEFT_POD_STATE``: its namespace, name, the uid the
hub read of the pod it made, when the stop failed), which only the Hub writes; and this
sweep deletes it:

- at each governor sync (``POST /hub/api/gpu-gov/queue``) the hub reads each recorded pod by
  its name (one bounded GET) and answers, as ``left_pods``, those still there as the hub made
  them (the recorded uid, KubeSpawner's annotations naming the server, not being deleted
  already) whose stop is older than ``ClusterGpus.left_pod_grace``: a pod that merely copies
  a server's labels, one made under its name since, or one of another namespace is none of
  them;
- the governor audits each (``left-pod-delete``), then asks for it
  (``POST /hub/api/gpu-gov/left-pods``);
- the hub checks it against its record again and deletes it with the uid as a precondition
  (a pod made under the name meanwhile is not the one deleted), and says so in its log. Once
  the pod is gone the record goes and the cluster is read again: its card is free.

Until then the pod counts as every GPU pod the hub's started servers do not hold: its card is
in use (``cluster.capacity``), so admission never hands it out twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from jupyterhub import orm
from jupyterhub.apihandlers.base import APIHandler
from sqlalchemy import Text, type_coerce
from tornado import web

from ..core import clock
from ..core.queue import QUEUE_SCOPE
from ..core.text import escaped
from ..core.vocabulary import server_key
from .cluster import ClusterGpus
from .grant_count import NOT_CACHED

LEFT_POD_STATE = "gpu-gov/left-pod"  # spawner state: the pod a stop could not delete
POD_UID_STATE = "gpu-gov/pod-uid"  # spawner state: the uid of the pod the start made
MAX_ASKED = 100  # pods one request may ask to delete
_FIELDS = ("namespace", "name", "uid", "stopped_at")
log = logging.getLogger("jupyter_gpu_gov.profiles")


def left_pod(
    namespace: str, name: str, uid: str | None, stopped_at: datetime, tier: str | None
) -> dict:
    """The record of a pod a stop could not delete (no uid: the hub never read the pod it made,
    and the sweep never deletes it)."""
    record = {
        "namespace": namespace,
        "name": name,
        "uid": uid or "",
        "stopped_at": clock.isoformat(stopped_at),
    }
    if tier:
        record["tier"] = tier
    return record


def from_state(state: Mapping | None) -> dict | None:
    """The recorded pod (``left_pod``) in a spawner's state, or None."""
    record = state.get(LEFT_POD_STATE) if isinstance(state, Mapping) else None
    if not isinstance(record, Mapping) or not all(isinstance(record.get(k), str) for k in _FIELDS):
        return None
    kept = {k: record[k] for k in _FIELDS}
    if isinstance(record.get("tier"), str):
        kept["tier"] = record["tier"]
    return kept


def _recorded(db) -> list[tuple[str, str]]:
    """(user, server name) of every spawner whose state records a pod left running (one query;
    only those rows are read)."""
    rows = (
        db.query(orm.User.name, orm.Spawner.name)
        .join(orm.User, orm.Spawner.user_id == orm.User.id)
        .filter(type_coerce(orm.Spawner.state, Text).like(f'%"{LEFT_POD_STATE}"%'))
        .execution_options(**NOT_CACHED)
    )
    return [(user, name or "") for user, name in rows]


def _spawners(handler: web.RequestHandler):
    for user_name, name in _recorded(handler.db):
        owner = handler.find_user(user_name)
        spawner = owner.spawners.get(name) if owner is not None else None
        if spawner is None and owner is not None:
            try:
                spawner = owner.get_spawner(name)
            except KeyError:
                continue
        if spawner is not None and getattr(spawner, "_gpu_left_pod", None):
            yield spawner


def _forget(spawner, why: str) -> None:
    """The recorded pod is gone (or is not the hub's any more): forget it; the cluster is read
    again at the next count, its card free."""
    record = spawner._gpu_left_pod
    spawner._gpu_left_pod = None
    spawner.orm_spawner.state = spawner.get_state()
    spawner.user.db.commit()
    spawner.gpu_cluster.read_at = float("-inf")
    log.info(
        "gpu-gov: the pod %s/%s that %s's stop left running %s",
        escaped(record["namespace"]),
        escaped(record["name"]),
        escaped(spawner._log_name),
        why,
    )


async def due(handler: web.RequestHandler, now: datetime) -> list[dict]:
    """The recorded pods to delete now, as the governor audits them (``left_pods``): still
    there as the hub made them, their stop older than the grace. Records of pods gone are
    forgotten here."""
    found = []
    for spawner in _spawners(handler):
        cluster: ClusterGpus = spawner.gpu_cluster
        if not cluster.left_pod_sweep:
            return []
        record = spawner._gpu_left_pod
        try:
            stopped = clock.parse(record["stopped_at"])
        except ValueError:
            stopped = None
        if stopped is None or (now - stopped).total_seconds() < cluster.left_pod_grace:
            continue
        try:
            pod = await spawner.gpu_read_pod(record["namespace"], record["name"])
        except Exception as error:  # the API still failing: asked again next sync
            log.debug(
                "gpu-gov: cannot read the pod %s/%s that %s's stop left running (%s)",
                escaped(record["namespace"]),
                escaped(record["name"]),
                escaped(spawner._log_name),
                escaped(f"{type(error).__name__}: {error}".splitlines()[0][:300]),
            )
            continue
        if pod is None:
            _forget(spawner, "is gone")
            continue
        metadata = pod.get("metadata") or {}
        if not record["uid"] or metadata.get("uid") != record["uid"]:
            _forget(spawner, "is not there: a pod of that name is not the one the hub made")
            continue
        if metadata.get("deletionTimestamp") or not _names(metadata, spawner):
            continue  # being deleted already; or not as KubeSpawner wrote it: never touched
        found.append(
            {
                "server": server_key(spawner.user.name, spawner.name or ""),
                **record,
                "node": (pod.get("spec") or {}).get("nodeName"),
            }
        )
    return found


def _names(metadata: Mapping, spawner) -> bool:
    """Whether the pod's annotations name ``spawner``'s server as KubeSpawner writes them."""
    notes = metadata.get("annotations") or {}
    return notes.get("hub.jupyter.org/username") == spawner.user.name and (
        notes.get("hub.jupyter.org/servername") or ""
    ) == (spawner.name or "")


async def delete(handler: web.RequestHandler, asked: list[Any]) -> dict[str, list[str]]:
    """Delete the pods ``asked`` (the governor's, audited) that the hub's records still say a
    stop left running, each with its uid as the delete's precondition."""
    done: dict[str, list[str]] = {"deleted": [], "refused": [], "failed": []}
    wanted = {}
    for entry in asked[:MAX_ASKED]:
        if isinstance(entry, Mapping) and all(isinstance(entry.get(k), str) for k in _FIELDS):
            wanted[(entry["namespace"], entry["name"], entry["uid"])] = entry
    for spawner in list(_spawners(handler)):
        record = spawner._gpu_left_pod
        key = (record["namespace"], record["name"], record["uid"])
        if not record["uid"] or wanted.pop(key, None) is None:
            continue
        pod = f"{record['namespace']}/{record['name']}"
        try:
            gone = await spawner.gpu_delete_pod(*key)
        except Exception as error:  # tried again at the next sync
            done["failed"].append(pod)
            log.warning(
                "gpu-gov: deleting the pod %s that %s's stop left running failed (%s); "
                "trying again at the next sync",
                escaped(pod),
                escaped(spawner._log_name),
                escaped(f"{type(error).__name__}: {error}".splitlines()[0][:300]),
            )
            continue
        done["deleted"].append(pod)
        if gone:
            _forget(spawner, "is gone")
        else:
            log.warning(
                "gpu-gov: deleted the pod %s (uid %s) that %s's stop left running since %s, "
                "holding its GPU",
                escaped(pod),
                escaped(record["uid"]),
                escaped(spawner._log_name),
                escaped(record["stopped_at"]),
            )
    done["refused"] = [f"{n}/{p}" for n, p, _ in wanted]  # not (or no longer) left running
    return done


class LeftPodsApiHandler(APIHandler):
    """``POST /hub/api/gpu-gov/left-pods`` ``{"pods": [...]}``: the governor, having audited
    them, asks for the pods a stop left running (``due``) to be deleted."""

    @web.authenticated
    async def post(self):
        if not {QUEUE_SCOPE, "admin:servers"} & set(self.expanded_scopes):
            raise web.HTTPError(403, f"Needs the {QUEUE_SCOPE} or admin:servers scope")
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            body = None
        pods = body.get("pods") if isinstance(body, dict) else None
        if not isinstance(pods, list):
            raise web.HTTPError(400, 'Send {"pods": [{"namespace", "name", "uid", ...}]}')
        answer = await asyncio.shield(delete(self, pods))  # (a dropped client stops none)
        self.finish(json.dumps(answer))
