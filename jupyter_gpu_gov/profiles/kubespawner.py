"""KubeSpawner glue: GPU tiers as KubeSpawner profiles, admission at spawn, ownership labels.

``GpuKubeSpawner`` is KubeSpawner with the profile layer mixed in:

- ``profile_list`` is a callable returning only the tiers offered to the user's teams, each with
  what its team has left in the description, and each carrying the tier's resource limit, node
  selector, node affinity and tolerations as its ``kubespawner_override``;
- the spawn form is the profile layer's (tiers, team, project, the memory estimate);
- ``start()`` admits the server against the hub's count (brought up to date with its database
  then) before KubeSpawner creates the pod;
- the pod carries the ownership labels (``gpu-gov/user``, ``team``, ``project``, ``tier``,
  ``borrowed``, ``max-age``; the prefix is ``GpuProfiles.label_prefix``) that dcgm-exporter's
  pod-label feature and dashboards read, with the raw values in annotations of the same names;
- a pod without a GPU says ``NVIDIA_VISIBLE_DEVICES=void`` (``get_env``);
- capacity comes from the cluster (``profiles/cluster.py``): the devices of the nodes each tier
  selects, less what other GPU pods hold (the hub's servers on other tiers sharing the cards
  included), read every ``cluster_refresh`` seconds.

Use it with ``c.JupyterHub.spawner_class = "jupyter_gpu_gov.profiles.kubespawner.GpuKubeSpawner"``
(``add_gpu_profiles(c, spawner="kubernetes")`` does that). The Zero to JupyterHub chart always
sets ``c.KubeSpawner.profile_list`` from ``singleuser.profileList`` (default ``[]``): an empty list
means "ours", anything else is refused with a message saying what to do.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import aiohttp
from kubernetes_asyncio.client import V1DeleteOptions, V1Preconditions
from kubernetes_asyncio.client.rest import ApiException
from kubespawner import KubeSpawner
from kubespawner.slugs import is_valid_label, safe_slug
from tornado import web
from traitlets import TraitError, default, validate

from ..core import clock
from ..core.text import escaped, in_sentence
from ..core.vocabulary import LABEL_PREFIX, TIER_LABEL, USER_LABEL, pod_key
from .cluster import ClusterGpus, scheduling
from .grant_count import kept_count
from .hubconfig import profile_list_refusal
from .left_pods import POD_UID_STATE, left_pod
from .left_pods import record as record_left_pod
from .quota import tier_use
from .spawner import NO_GPU, GpuProfilesMixin
from .tiers import GPU_VENDOR_PREFIX, Tier


def _reflector_dead(reflector) -> bool:
    """Whether a KubeSpawner reflector will never change again: its first list failed, or its
    watch task ended (it gave up). One still loading is not: its first list is awaited."""
    loaded = reflector.first_load_future
    if not loaded.done():
        return False
    if loaded.cancelled() or loaded.exception() is not None:
        return True
    return reflector.watch_task is None or reflector.watch_task.done()


def tier_override(tier: Tier) -> dict[str, Any]:
    """What a tier sets on KubeSpawner (the admin's own ``kubespawner_override`` last).

    Node selector, tolerations and required node affinity are added to what KubeSpawner is
    configured with (e.g. z2jh's ``singleuser.nodeSelector``, ``hub.jupyter.org/dedicated``
    tolerations and node-purpose affinity), not put in its place: they are callables of the
    spawner, as ``kubespawner_override`` allows.
    """
    tolerations = [dict(t) for t in tier.tolerations]
    expressions = [dict(e) for e in tier.node_affinity]
    override: dict[str, Any] = {
        # Extended resources are requested by their limit (the request defaults to it).
        "extra_resource_limits": lambda spawner: {
            **_without_gpus(spawner),  # the tier's devices, not also those configured for all
            tier.resource: str(tier.count),
        },
        "node_selector": lambda spawner: {**spawner.node_selector, **tier.node_selector},
        "tolerations": lambda spawner: _with_tolerations(spawner.tolerations, tolerations),
    }
    if expressions:
        override["node_affinity_required"] = lambda spawner: _with_expressions(
            spawner.node_affinity_required, expressions
        )
    override.update(tier.kubespawner_override)
    return override


def _without_gpus(spawner) -> dict:
    """NVIDIA's extended resources taken out of the spawner's (KubeSpawner merges an override's
    dict, None removing a key): an admin's KubeSpawner-wide ``extra_resource_limits`` (z2jh's
    ``singleuser.extraResource.limits``) gave a "No GPU" server a card no quota counted, on a
    server the Hub records as holding none, and a tier's server (a MIG slice's) a whole card
    besides its own."""
    limits = spawner.extra_resource_limits
    return {k: None for k in limits if str(k).startswith(GPU_VENDOR_PREFIX)}


def _with_tolerations(configured: list | dict, extra: list[dict]) -> list | dict:
    if isinstance(configured, dict):  # KubeSpawner's keyed form
        return {**configured, **{f"gpu-gov-{i}": t for i, t in enumerate(extra)}}
    return [*configured, *(t for t in extra if t not in configured)]


def _with_expressions(configured: list | dict, extra: list[dict]) -> list | dict:
    # Required node selector terms are ORed: the tier's expressions must join every term.
    def joined(term):
        term = term if isinstance(term, dict) else term.to_dict()
        key = "match_expressions" if "match_expressions" in term else "matchExpressions"
        return {**term, key: [*(term.get(key) or []), *extra]}

    if isinstance(configured, dict):
        return {k: joined(t) for k, t in configured.items()} or {
            "gpu-gov": {"matchExpressions": extra}
        }
    return [joined(t) for t in configured] or [{"matchExpressions": extra}]


def _rebased(base: Any, left: Any, now: Any) -> Any:
    """``base`` with what changed from ``left`` (as the last spawn left a value, its tier's
    override included) to ``now`` (a hook's change since): a hook that assigns a fresh value
    gets it, one that adds to the value in place gets ``base`` plus its additions; unchanged,
    ``base`` (the last tier's part gone)."""
    if now == left:
        return base
    if isinstance(base, dict) and isinstance(left, dict) and isinstance(now, dict):
        rebased = {k: v for k, v in base.items() if k not in left or k in now}
        rebased.update({k: v for k, v in now.items() if k not in left or left[k] != v})
        return rebased
    if isinstance(base, list) and isinstance(left, list) and isinstance(now, list):
        kept = [v for v in base if v not in left or v in now]
        return kept + [v for v in now if v not in left and v not in kept]
    return now


async def gpu_profile_list(spawner: GpuKubeSpawner) -> list[dict[str, Any]]:
    """KubeSpawner's ``profile_list``: the tiers offered to the user's teams, with what is left."""
    conf = spawner.gpu_profiles
    teams = await spawner.gpu_teams()
    await spawner.gpu_refresh()
    usage = spawner.gpu_held()
    capacity = spawner.gpu_capacity(usage)
    descriptions: dict[str, list[str]] = {}
    for team in teams:
        for use in tier_use(
            spawner.user.name,
            team,
            usage,
            capacity,
            conf.quota_map,
            conf.tier_map,
            server=spawner._gpu_server_key(),
        ):
            admission = use.admission
            state = (
                "would borrow"
                if admission.borrowed
                else f"{use.guaranteed_left} of {use.guaranteed} guaranteed left"
                if admission.allowed
                else "not now"
            )
            descriptions.setdefault(use.tier, []).append(f"{in_sentence(team)}: {state}")
    profiles = [
        {
            "display_name": in_sentence(tier.display_name),  # plain text beside KubeSpawner's
            "slug": tier.name,
            "description": " · ".join([tier.summary, *descriptions[tier.name]]),
            "kubespawner_override": tier_override(tier),
        }
        for tier in conf.tier_map.values()
        if tier.name in descriptions
    ]
    if conf.allow_no_gpu:
        # The default: a server started without a choice (e.g. through the REST API) gets no GPU,
        # which is also what admission assumes.
        profiles.append(
            {
                "display_name": "No GPU",
                "slug": NO_GPU,
                "description": "CPU only; counts against no quota",
                "default": True,
                "kubespawner_override": {"extra_resource_limits": _without_gpus},
            }
        )
    return profiles


class GpuStartFailed(web.HTTPError):
    """An admitted server whose pod the Kubernetes API would not create; JupyterHub shows
    ``jupyterhub_message``."""

    def __init__(self, message: str) -> None:
        super().__init__(503, "gpu-gov: %s", escaped(message))  # (it quotes the API)
        self.jupyterhub_message = message


def kubernetes_failure(error: Exception) -> str | None:
    """What failed, in a line, when ``error`` is the Kubernetes API's (an error status, a
    failed connection); None for any other error."""
    if isinstance(error, ApiException):
        try:
            said = json.loads(error.body)["message"]
        except (TypeError, ValueError, KeyError):
            said = error.reason
        # Its words may quote a name (an annotation's value: the user's), shown as plain text.
        said = in_sentence(" ".join(str(said or "").split())[:300])
        return f"the Kubernetes API answered {error.status} ({said}) when asked for its pod"
    if isinstance(error, aiohttp.ClientError):
        said = " ".join(str(error).split())[:300]
        return f"the connection to the Kubernetes API failed ({type(error).__name__}: {said})"
    return None


class GpuKubeSpawner(GpuProfilesMixin, KubeSpawner):
    """KubeSpawner with GPU tiers, team quotas, admission and ownership labels."""

    _gpu_configured: dict[str, Any] | None = None  # what the tiers override, before any tier
    _gpu_left: dict[str, Any] | None = None  # the same, as the last spawn left them
    _gpu_pod_uid: str | None = None  # the uid of the pod this server's start made

    @default("profile_list")
    def _gpu_profile_list(self):
        return gpu_profile_list

    @validate("profile_list")
    def _gpu_only_profile_list(self, proposal):
        # z2jh sets profile_list from singleuser.profileList, [] by default: that means ours.
        if proposal.value is gpu_profile_list or proposal.value == []:
            return gpu_profile_list
        raise TraitError(profile_list_refusal(proposal.value, "GpuKubeSpawner.profile_list"))

    @property
    def gpu_cluster(self) -> ClusterGpus:
        return ClusterGpus.instance(config=self.config)

    async def _start_reflector(self, kind, reflector_class, replace=False, **kwargs):
        # KubeSpawner keeps one reflector per kind and namespace for all spawners and hands
        # out the one it has, whatever became of it. One whose first list failed (the API
        # slow or failing at the hub's first poll, or at the cleanup of a refused spawn) or
        # whose watch gave up never changes again: every later start waited for its pod there
        # until start_timeout, and every poll found no pod (the server taken for stopped).
        # Such a one is replaced, as KubeSpawner itself does after a start timed out.
        kept = type(self).reflectors.get(self._get_reflector_key(kind))
        if not replace and kept is not None and _reflector_dead(kept):
            self.log.warning(
                "gpu-gov: the hub's watch of %s in %s had stopped (its first list failed, or "
                "its watch gave up); starting it again",
                kind,
                escaped(self.namespace),
            )
            replace = True
        try:
            return await super()._start_reflector(kind, reflector_class, replace=replace, **kwargs)
        except asyncio.CancelledError:
            # KubeSpawner's start cancels the other reflector's start when one fails (the
            # pods' first list failed: the events' list was cut off). The one it made then
            # never loads, and every later start awaited its first load until start_timeout:
            # marked failed, it is replaced at the next start.
            made = type(self).reflectors.get(self._get_reflector_key(kind))
            if made is not kept and made is not None and not made.first_load_future.done():
                made.first_load_future.set_exception(
                    RuntimeError(f"the hub's first list of {kind} was cut off")
                )
                made.first_load_future.exception()  # (read: no "never retrieved" at exit)
            raise

    def gpu_capacity(self, usage):
        conf = self.gpu_profiles
        static = dict(conf.capacity)
        hub_pods = dict(self._gpu_pods)  # the last count's (gpu_held), this server's own too
        granted = self.gpu_grant.get(TIER_LABEL)
        own = conf.tier_map.get(conf.tier_renamed.get(granted, granted))
        if own is not None:
            hub_pods[pod_key(self.namespace, self.pod_name)] = own.name
        counted = self.gpu_cluster.capacity(
            conf.tier_map, self, hub_pods=hub_pods, grow=conf.node_pools
        )
        if counted is None:  # nodes not readable (yet): the configured numbers
            return static
        return {t: min(n, static[t]) if t in static else n for t, n in counted.items()}

    def gpu_cards_held(self, usage, servers=None):
        # Which card a capability class's (borrowed) server holds: its pod's node's product.
        if servers is None:
            classes = [t.name for t in self.gpu_profiles.tier_map.values() if t.card is None]
            servers = {g.server for name in classes for g in usage.borrowed(name)}
        if not servers:
            return None
        pods = kept_count(self.user.db).pods_of_servers(servers)
        return self.gpu_cluster.products(pods)

    def gpu_cards(self):
        conf = self.gpu_profiles
        counted = self.gpu_cluster.cards(conf.tier_map, self, grow=conf.node_pools)
        if counted is None:  # nodes not readable (yet): the configured numbers (capacity's)
            return {}
        static = conf.capacity
        return {t: min(n, static[t]) if t in static else n for t, n in counted.items()}

    async def gpu_refresh(self):
        # A fresh enough reading of the cluster before admission counts (and awaits nothing).
        # The nodes each tier's pods could land on are worked out with it, off the loop.
        fits = [(t.resource, scheduling(self, t)) for t in self.gpu_profiles.tier_map.values()]
        await self.gpu_cluster.refresh(
            self.api, self.namespace, self.log, timeout=self.k8s_api_request_timeout, fits=fits
        )

    def gpu_unknown(self) -> str | None:
        return self.gpu_cluster.unknown()

    async def load_user_options(self):
        # JupyterHub keeps a server's Spawner across stop and start, and KubeSpawner merges a
        # profile's overrides into the current values: put back what the tiers override as it
        # was before the first spawn, or a server restarted on another tier (or without a GPU)
        # would still ask for the previous tier's devices, on the previous tier's nodes. What a
        # hook changed since the last spawn (a pre_spawn_hook's toleration, per spawn) is kept.
        keys = {k for t in self.gpu_profiles.tier_map.values() for k in tier_override(t)}
        if self._gpu_configured is None:
            self._gpu_configured = {
                k: copy.deepcopy(getattr(self, k)) for k in sorted(keys) if self.has_trait(k)
            }
        left = self._gpu_left or {}
        for key, value in self._gpu_configured.items():
            if key in left:
                value = self._gpu_configured[key] = _rebased(value, left[key], getattr(self, key))
            setattr(self, key, copy.deepcopy(value))
        await super().load_user_options()
        self._gpu_left = {k: copy.deepcopy(getattr(self, k)) for k in self._gpu_configured}

    def gpu_start_failed(self, error: Exception) -> Exception:
        # KubeSpawner lets the Kubernetes client's errors through as they are: an ApiException
        # is a page of HTTP headers and body, a dropped connection a class name. Say what failed.
        why = kubernetes_failure(error)
        if why is None:
            return error
        return GpuStartFailed(
            f"Your server could not be started: {why}. Nothing is held for it; try again in a "
            "few minutes, and tell your hub admin if it goes on."
        )

    async def _make_delete_pod_request(self, pod_name, delete_options, grace, request_timeout):
        # KubeSpawner retries a delete only when its request times out: a 5xx, a 429 or a
        # dropped connection raised at once, and JupyterHub then records the server stopped
        # (``User.stop``) with its pod, and its GPU, left running for nobody to delete. Tried
        # again like a timeout, within ``k8s_api_request_retry_timeout``.
        try:
            return await super()._make_delete_pod_request(
                pod_name, delete_options, grace, request_timeout
            )
        except (ApiException, aiohttp.ClientError) as error:
            if isinstance(error, ApiException) and error.status < 500 and error.status != 429:
                raise
            self.log.warning(
                "gpu-gov: deleting pod %s/%s failed (%s); trying again",
                escaped(self.namespace),
                escaped(pod_name),
                escaped(kubernetes_failure(error)),
            )
            return False

    async def start(self):
        url = await super().start()
        self._gpu_pod_uid = self.pod_id  # (KubeSpawner read it of the running pod it made)
        return url

    async def stop(self, now=False):
        # The uid of the pod this server's start made (or, when the hub has none recorded, of
        # the pod of that name the hub's own watch holds): the one a left pod's sweep deletes.
        seen = (
            self.pod_reflector.pods.get(f"{self.namespace}/{self.pod_name}")
            if (self.pod_reflector is not None)
            else None
        )
        uid = self._gpu_pod_uid or ((seen or {}).get("metadata") or {}).get("uid")
        tier = self.gpu_grant.get(TIER_LABEL)
        try:
            await super().stop(now=now)
        except BaseException:
            # JupyterHub records the server stopped all the same: its pod, and its GPU, would
            # be left running for nobody to delete. Recorded for the sweep, where deleting
            # the user or the server leaves the record (``left_pods.py``).
            pod = left_pod(self.namespace, self.pod_name, uid, clock.utcnow(), tier)
            record_left_pod(self.user.db, pod, self.user.name, self.name or "")
            # No longer the hub's server, its pod counts as another's: on the cluster's
            # reading, which must be one that has it (not one from before it was made).
            self.gpu_cluster.read_again()
            self.log.warning(
                "gpu-gov: the pod %s/%s of %s could not be deleted; its card counts as held "
                "until the hub deletes it, %g s from now at the earliest (c.ClusterGpus."
                "left_pod_grace), once the governor has audited it",
                escaped(self.namespace),
                escaped(self.pod_name),
                escaped(self._log_name),
                self.gpu_cluster.left_pod_grace,
            )
            raise
        self._gpu_pod_uid = None
        # A reading taken while the server ran has its pod, no longer the hub's server's: on
        # it the card it gave back counted as held (up to FRESH_FOR_S), and a spawn was refused.
        self.gpu_cluster.read_again()

    async def gpu_read_pod(self, namespace: str, name: str) -> dict | None:
        """The pod's JSON as the API has it (None: there is none), within the request timeout."""
        try:
            response = await asyncio.wait_for(
                self.api.read_namespaced_pod(name, namespace, _preload_content=False),
                self.k8s_api_request_timeout,
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        try:
            body = await response.read()
        finally:
            response.release()
        if response.status == 404:
            return None
        if response.status != 200:  # (the client raises for no status of a response it does
            # not read: a 503's Status was taken for another pod of that name, and forgotten)
            error = ApiException(status=response.status, reason=response.reason)
            error.body = body
            raise error
        return json.loads(body)

    async def gpu_delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        """Delete the pod ``uid`` (never another made under its name since); True when it is
        gone already (or the name holds another pod), False when the delete was accepted."""
        options = V1DeleteOptions(
            grace_period_seconds=self.delete_grace_period,
            preconditions=V1Preconditions(uid=uid),
        )
        try:
            await asyncio.wait_for(
                self.api.delete_namespaced_pod(name, namespace, body=options),
                self.k8s_api_request_timeout,
            )
        except ApiException as error:
            if error.status in (404, 409):  # gone; or the uid is not the name's pod's
                return True
            raise
        return False

    def get_state(self):
        state = super().get_state()
        if self._gpu_pod_uid:
            state[POD_UID_STATE] = self._gpu_pod_uid
        return state

    def load_state(self, state):
        super().load_state(state)
        uid = state.get(POD_UID_STATE)
        self._gpu_pod_uid = uid if isinstance(uid, str) else None

    def clear_state(self):
        super().clear_state()
        self._gpu_pod_uid = None

    def get_env(self):
        env = super().get_env()
        if not self.gpu_grant:
            # No device from the device plugin, but where the NVIDIA runtime is the node's
            # default (the GPU operator's setting) it shows a container what
            # NVIDIA_VISIBLE_DEVICES names: "all" in CUDA images, every card of the node, which
            # no quota counts and other servers hold. "void": what runc does, no card. (A GPU
            # pod gets the device plugin's value, which replaces the container's.) Set here,
            # per spawn, not as a profile override: those are merged into the spawner's
            # environment, which hooks (auth_state_hook, pre_spawn_hook) set per spawn too.
            env["NVIDIA_VISIBLE_DEVICES"] = "void"
        return env

    async def get_pod_manifest(self):
        pod = await super().get_pod_manifest()
        grant = self.gpu_grant
        if grant:
            prefix = self.gpu_profiles.label_prefix
            raw = {
                prefix + key.removeprefix(LABEL_PREFIX): value
                for key, value in {USER_LABEL: self.user.name, **grant}.items()
            }
            pod.metadata.labels.update(
                {key: safe_slug(value, is_valid=is_valid_label) for key, value in raw.items()}
            )
            pod.metadata.annotations.update(raw)
        return pod
