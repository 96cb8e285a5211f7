"""Pods the hub's stop could not delete: recorded, found, audited, deleted.

A server's stop deletes its pod, tried again within KubeSpawner's
``k8s_api_request_retry_timeout`` (``GpuKubeSpawner._make_delete_pod_request``). When the
Kubernetes API fails longer, JupyterHub records the server stopped all the same (``User.stop``)
with its pod running and holding its GPU, for nobody to delete. ``GpuKubeSpawner.stop`` then
records the pod (``record``: its namespace, name, the uid the hub read of the pod it made, the
server, when the stop failed) in a table of the profile layer's own in the Hub's database
(``gpu_gov_left_pods``), which only the Hub writes and which deleting the user or the named
server leaves alone (a record in the spawner's state went with them, and the pod kept its GPU
for ever); and this sweep deletes it:

- at each governor sync (``POST /hub/api/gpu-gov/queue``) the hub reads each recorded pod by
  its name (one bounded GET) and answers, as ``left_pods``, those still there as the hub made
  them (the recorded uid, KubeSpawner's annotations naming the recorded server, not being
  deleted already) whose stop is older than ``ClusterGpus.left_pod_grace``: a pod that merely
  copies a server's labels, one made under its name since (a running server's: a start makes a
  new pod, never takes the old one on), or one of another namespace is none of them;
- the governor audits each (``left-pod-delete``), then asks for it
  (``POST /hub/api/gpu-gov/left-pods``);
- the hub checks it against its record again and deletes it with the uid as a precondition
  (a pod made under the name meanwhile is not the one deleted), and says so in its log. Once
  the pod is gone the record goes and the cluster is read again: its card is free.

The sweep's calls go through one spawner of the hub's class made for no user (``_sweeper``):
the server whose stop left the pod may be deleted. While the Kubernetes API fails its reads
(a 5xx, a 429, no answer), the sweep backs off (``_Sweep``): one read, then none for
``BACKOFF_FIRST_S``, doubling up to ``BACKOFF_MOST_S``, and back to every sync once a read is
answered; the Hub's log says so once an outage (a warning as it starts, a line as it ends), not
at every sync. Until the pod goes it counts as every GPU pod the hub's started servers do not hold: its card is in use (``cluster.capacity``), so
admission never hands it out twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from collections.abc import Mapping
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from jupyterhub.apihandlers.base import APIHandler
from kubernetes_asyncio.client.rest import ApiException
from sqlalchemy import Column, MetaData, Table, Unicode, insert, inspect, select
from sqlalchemy import delete as sql_delete
from sqlalchemy.exc import DBAPIError
from tornado import web

from ..core import browser_json, clock
from ..core.queue import QUEUE_SCOPE
from ..core.text import escaped
from ..core.vocabulary import DNS_SUBDOMAIN, server_key
from .cluster import ClusterGpus

POD_UID_STATE = "gpu-gov/pod-uid"  # spawner state: the uid of the pod the start made
MAX_ASKED = 100  # pods one request may ask to delete
_FIELDS = ("namespace", "name", "uid", "stopped_at")
log = logging.getLogger("jupyter_gpu_gov.profiles")

# The pods stops left running, in the Hub's database: never in a row that goes with its user.
LEFT_PODS = Table(
    "gpu_gov_left_pods",
    MetaData(),
    Column("namespace", Unicode(255), primary_key=True),
    Column("name", Unicode(255), primary_key=True),
    Column("uid", Unicode(255), nullable=False),  # "": the hub never read it (never deleted)
    Column("user", Unicode(255), nullable=False),  # the server whose stop left it
    Column("server", Unicode(255), nullable=False),  # (its name; "" the default server)
    Column("stopped_at", Unicode(64), nullable=False),
    Column("tier", Unicode(255)),
)
_MADE: weakref.WeakSet = weakref.WeakSet()  # the engines whose table this process has made
BACKOFF_FIRST_S = 10.0  # no read for this long after the API failed one, then twice as long...
BACKOFF_MOST_S = 160.0  # ...up to this: a left pod goes at most this long after the API is back
REFUSED_SAID_AGAIN_S = 24 * 3600.0  # a pod whose read the API refuses is warned of again after
_monotonic = time.monotonic  # (a test's clock)


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


def _table(db) -> None:
    """Make the table, once per database and process. Another hub (or this one's restart, a
    rolling update's new pod) making it at once: its CREATE may come between this one's look
    and its own, which then fails ("already exists", or PostgreSQL's duplicate type); the
    table is there all the same, and the start goes on."""
    engine = db.get_bind()
    if engine in _MADE:
        return
    db.commit()  # what the session holds is not lost with a failed CREATE's rollback
    try:
        LEFT_PODS.create(db.connection(), checkfirst=True)
        db.commit()
    except DBAPIError:
        db.rollback()
        if not inspect(db.connection()).has_table(LEFT_PODS.name):
            raise
        db.commit()
    _MADE.add(engine)


def _insert(db, record: Mapping, user: str, server: str) -> None:
    db.execute(
        sql_delete(LEFT_PODS).where(
            LEFT_PODS.c.namespace == record["namespace"], LEFT_PODS.c.name == record["name"]
        )
    )
    db.execute(
        insert(LEFT_PODS).values(
            **{k: record[k] for k in _FIELDS}, tier=record.get("tier"), user=user, server=server
        )
    )


def record(db, pod: Mapping, user: str, server: str) -> None:
    """Keep ``pod`` (``left_pod``), which the stop of ``user``'s ``server`` left running."""
    _table(db)
    _insert(db, pod, user, server)
    db.commit()


def _recorded(db) -> list[dict]:
    _table(db)
    return [dict(row) for row in db.execute(select(LEFT_PODS)).mappings()]


class _Sweep:
    """The sweep's caller of the API (``spawner``) and its back-off while the API fails."""

    def __init__(self, spawner) -> None:
        self.spawner = spawner
        self.failures = 0  # reads failed in a row (0: the API answers)
        self.until = float("-inf")  # no read before (``_monotonic``)
        # The recorded pods whose read the API refuses, and when that was last said (a warning
        # once a pod, and again every ``REFUSED_SAID_AGAIN_S``): a pod's goes when its read is
        # answered or its record goes, so a long-running hub keeps no entry of a pod gone.
        self.refused: dict[tuple[str, str], float] = {}

    def ready(self) -> bool:
        return _monotonic() >= self.until

    def failed(self, record: Mapping, error: BaseException) -> None:
        self.failures += 1
        pause = min(BACKOFF_FIRST_S * 2 ** (self.failures - 1), BACKOFF_MOST_S)
        self.until = _monotonic() + pause
        said = _failure(error)
        if self.failures == 1:  # once an outage
            log.warning(
                "gpu-gov: the Kubernetes API failed the read of the pod %s/%s that %s's stop "
                "left running (%s); the pods stops left running are read again in %g s, then "
                "less often, at most %g s apart, until it answers",
                escaped(record["namespace"]),
                escaped(record["name"]),
                escaped(_whose(record)),
                escaped(said),
                pause,
                BACKOFF_MOST_S,
            )
        else:
            log.debug("gpu-gov: the sweep's read failed again (%s)", escaped(said))

    def still_recorded(self, records: list[dict]) -> None:
        """Forget the refusals of pods no longer recorded (gone, or deleted by hand)."""
        kept = {(r["namespace"], r["name"]) for r in records}
        for pod_id in [p for p in self.refused if p not in kept]:
            del self.refused[pod_id]

    def refusal_to_say(self, pod_id: tuple[str, str]) -> bool:
        """Whether this refusal of ``pod_id``'s read is to be warned of (first, or a day on)."""
        said = self.refused.get(pod_id)
        if said is not None and _monotonic() - said < REFUSED_SAID_AGAIN_S:
            return False
        self.refused[pod_id] = _monotonic()
        return True

    def answered(self) -> None:
        if self.failures:
            log.info(
                "gpu-gov: the Kubernetes API answers the sweep of pods stops left running "
                "again (after %d failed reads)",
                self.failures,
            )
        self.failures, self.until = 0, float("-inf")


def _failure(error: BaseException) -> str:
    """What failed, in a line: the API's status and its Status's message, or the error."""
    if isinstance(error, ApiException):
        try:
            said = json.loads(error.body)["message"]
        except (TypeError, ValueError, KeyError):
            said = error.reason
        return " ".join(f"{error.status}: {said}".split())[:300]
    if isinstance(error, asyncio.TimeoutError):
        return "no answer in time"
    return " ".join(f"{type(error).__name__}: {error}".split())[:300]


# The sweep's spawner's user: a stand-in with what KubeSpawner's constructor reads of one (its
# name templates' name and id), given through JupyterHub's public ``Spawner.user`` trait, as
# the Hub gives a user's; KubeSpawner's own ``_mock=True`` does the same, but is private.
_NO_USER = SimpleNamespace(name="gpu-gov-left-pod-sweep", id=0, url="")


def _sweeper(handler: web.RequestHandler) -> _Sweep | None:
    """The sweep's calls to the API go through a spawner of the hub's class made once per
    process for no user (``_NO_USER``): the owner of a recorded pod may be deleted. None
    where the hub's spawner is not ``GpuKubeSpawner`` (nothing is recorded)."""
    spawner_class = handler.settings.get("spawner_class")
    if not hasattr(spawner_class, "gpu_read_pod"):
        return None
    config = handler.settings.get("config")
    cluster = ClusterGpus.instance(config=config)
    if cluster.left_pod_sweeper is None:
        cluster.left_pod_sweeper = _Sweep(spawner_class(user=_NO_USER, config=config))
    return cluster.left_pod_sweeper


def _whose(record: Mapping) -> str:
    return server_key(record["user"], record["server"])


def _forget(handler: web.RequestHandler, cluster: ClusterGpus, record: Mapping, why: str) -> None:
    """The recorded pod is gone (or is not the hub's any more): forget it; the cluster is read
    again at the next count, its card free."""
    handler.db.execute(
        sql_delete(LEFT_PODS).where(
            LEFT_PODS.c.namespace == record["namespace"],
            LEFT_PODS.c.name == record["name"],
            LEFT_PODS.c.uid == record["uid"],
        )
    )
    handler.db.commit()
    cluster.read_again()
    log.info(
        "gpu-gov: the pod %s/%s that %s's stop left running %s",
        escaped(record["namespace"]),
        escaped(record["name"]),
        escaped(_whose(record)),
        why,
    )


async def due(handler: web.RequestHandler, now: datetime) -> list[dict]:
    """The recorded pods to delete now, as the governor audits them (``left_pods``): still
    there as the hub made them, their stop older than the grace. Records of pods gone are
    forgotten here."""
    sweep = _sweeper(handler)
    if sweep is None or not sweep.spawner.gpu_cluster.left_pod_sweep:
        return []
    cluster: ClusterGpus = sweep.spawner.gpu_cluster
    found = []
    records = _recorded(handler.db)
    sweep.still_recorded(records)
    for record in records:
        try:
            stopped = clock.parse(record["stopped_at"])
        except ValueError:
            stopped = None
        if stopped is None or (now - stopped).total_seconds() < cluster.left_pod_grace:
            continue
        if not record["uid"]:
            _forget(handler, cluster, record, "is not known: the hub never read the pod it made")
            continue
        if not sweep.ready():  # the API failing: not read at every sync
            break
        pod_id = (record["namespace"], record["name"])
        try:
            pod = await sweep.spawner.gpu_read_pod(record["namespace"], record["name"])
            read = None if pod is None else _read(pod)
        except (ValueError, RecursionError) as odd:  # answered, but with no pod: this one's
            sweep.answered()
            _no_pod(sweep, record, odd)
            continue
        except Exception as error:
            status = getattr(error, "status", None) or 0
            if 400 <= status < 500 and status != 429:  # this read refused (RBAC), not an
                # outage: the others are read, and it is asked again next sync. The admin must
                # learn it (the pod is never swept while refused): a warning once a pod (and
                # once a day while it lasts).
                say = sweep.refusal_to_say(pod_id)
                log.log(
                    logging.WARNING if say else logging.DEBUG,
                    "gpu-gov: cannot read the pod %s/%s that %s's stop left running (%s): it"
                    " is not swept while the Kubernetes API refuses its read; delete it by hand"
                    " or grant the hub's service account get on pods in that namespace",
                    escaped(record["namespace"]),
                    escaped(record["name"]),
                    escaped(_whose(record)),
                    escaped(_failure(error)),
                )
                continue
            sweep.failed(record, error)  # a 5xx, a 429, no answer, a dropped connection
            break
        sweep.answered()
        sweep.refused.pop(pod_id, None)  # (refused again: said)
        if read is None:
            _forget(handler, cluster, record, "is gone")
            continue
        uid, deleting, notes, node = read
        if uid != record["uid"]:
            _forget(
                handler,
                cluster,
                record,
                "is not there: a pod of that name is not the one the hub made",
            )
            continue
        if deleting or not _names(notes, record):
            continue  # being deleted already; or not as KubeSpawner wrote it: never touched
        found.append(
            {
                "server": _whose(record),
                **{k: record[k] for k in _FIELDS},
                **({"tier": record["tier"]} if record.get("tier") else {}),
                "node": node,
            }
        )
    return found


def _read(pod: Any) -> tuple[Any, bool, Mapping, str | None]:
    """What the sweep reads of the API's answer for a pod: its uid, whether it is being
    deleted, its annotations, and its node (None: none, or a name no node has). Raises
    ``ValueError`` for an answer out of a pod's shape (a list, a metadata that is null or no
    object): one such answer raised out of the sweep, no other left pod swept."""
    if not isinstance(pod, Mapping):
        raise ValueError(f"a JSON {type(pod).__name__}, not an object")
    metadata, spec = pod.get("metadata"), pod.get("spec") or {}
    notes = metadata.get("annotations") or {} if isinstance(metadata, Mapping) else None
    if not isinstance(metadata, Mapping) or not isinstance(notes, Mapping):
        raise ValueError("its metadata or annotations are no object")
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    node = node if isinstance(node, str) and DNS_SUBDOMAIN.fullmatch(node) else None
    return metadata.get("uid"), bool(metadata.get("deletionTimestamp")), notes, node


def _no_pod(sweep: _Sweep, record: Mapping, odd: BaseException) -> None:
    """The API answered a recorded pod's read with no pod: it is left alone (recorded still,
    read again at the next sync), said once a day while it lasts, and the others are read."""
    say = sweep.refusal_to_say((record["namespace"], record["name"]))
    log.log(
        logging.WARNING if say else logging.DEBUG,
        "gpu-gov: the Kubernetes API's answer for the pod %s/%s that %s's stop left running is"
        " no pod (%s): it is not swept while the answer is out of shape",
        escaped(record["namespace"]),
        escaped(record["name"]),
        escaped(_whose(record)),
        escaped(" ".join(f"{type(odd).__name__}: {odd}".split())[:300]),
    )


def _names(notes: Mapping, record: Mapping) -> bool:
    """Whether the pod's annotations name the recorded server as KubeSpawner writes them."""
    return (
        notes.get("hub.jupyter.org/username") == record["user"]
        and (notes.get("hub.jupyter.org/servername") or "") == record["server"]
    )


async def delete(handler: web.RequestHandler, asked: list[Any]) -> dict[str, list[str]]:
    """Delete the pods ``asked`` (the governor's, audited) that the hub's records still say a
    stop left running, each with its uid as the delete's precondition."""
    done: dict[str, list[str]] = {"deleted": [], "refused": [], "failed": []}
    wanted = {}
    for entry in asked[:MAX_ASKED]:
        if isinstance(entry, Mapping) and all(isinstance(entry.get(k), str) for k in _FIELDS):
            wanted[(entry["namespace"], entry["name"], entry["uid"])] = entry
    sweep = _sweeper(handler)
    for record in _recorded(handler.db) if sweep is not None else ():
        key = (record["namespace"], record["name"], record["uid"])
        if not record["uid"] or wanted.pop(key, None) is None:
            continue
        pod = f"{record['namespace']}/{record['name']}"
        try:
            gone = await sweep.spawner.gpu_delete_pod(*key)
        except Exception as error:  # tried again at the next sync
            done["failed"].append(pod)
            log.warning(
                "gpu-gov: deleting the pod %s that %s's stop left running failed (%s); "
                "trying again at the next sync",
                escaped(pod),
                escaped(_whose(record)),
                escaped(_failure(error)),
            )
            continue
        done["deleted"].append(pod)
        if gone:
            _forget(handler, sweep.spawner.gpu_cluster, record, "is gone")
        else:
            log.warning(
                "gpu-gov: deleted the pod %s (uid %s) that %s's stop left running since %s, "
                "holding its GPU",
                escaped(pod),
                escaped(record["uid"]),
                escaped(_whose(record)),
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
        self.finish(browser_json.dumps(answer))
