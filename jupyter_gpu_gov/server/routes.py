"""REST routes of the server extension, under ``/jupyter-gpu-gov/``."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web

from ..checkpoint_layout import SOURCE_USER, SOURCES, is_checkpoint_id
from ..core import browser_json
from ..core.vocabulary import CULL_REASONS
from ..core.wire import reason_too_long
from .checkpoint import list_checkpoints, read_manifest
from .sampler import NoSample

AUTH_RESOURCE = "gpu-gov"


class Stopping(Exception):
    """The server's stop began (or ended a checkpoint in progress): nothing more is done."""


class GpuGovHandler(ExtensionHandlerMixin, APIHandler):
    auth_resource = AUTH_RESOURCE
    # A browser tab polling GPU status is not someone working.
    _track_activity = False

    @property
    def gpu_gov(self):
        return self.extensionapp

    def owner_asks(self) -> bool:
        """Whether this server's owner is the one asking (the Hub's login says who), or no Hub
        login (no one else can reach the server). A Hub service named as the owner is not the
        owner (the Hub names services and users apart)."""
        hub_auth = getattr(self.identity_provider, "hub_auth", None)
        if hub_auth is None:
            return True
        user, owner = self.current_user, self.gpu_gov.server_identity["user"]
        kind = (getattr(user, "hub_user", None) or {}).get("kind", "user")
        return kind == "user" and getattr(user, "username", owner) == owner

    def asker_token(self) -> str | None:
        """The token the person asking sent this server (header, URL or the login's cookie),
        where they are not its owner: a guest of a shared server, or an admin. Sent on with the
        ask, the governor puts that person on record, as the Hub says the token is theirs and
        reaches this server; forwarded with this server's token alone, bob's Stop on alice's
        shared server was audited as alice's. None: the owner asked (the server's token says
        so), or no Hub login (no one else can reach the server)."""
        if self.owner_asks():
            return None
        return self.identity_provider.hub_auth.get_token(self) or None

    def as_seen_by_asker(self, verdict):
        """The verdict as the person asking may see it: the owner's other servers the spawn
        queue started (``started_from_line``: their names, tiers and times) are the owner's
        alone; a guest of a shared server (or an admin in its JupyterLab) read them here."""
        if not isinstance(verdict, dict) or not verdict.get("started_from_line"):
            return verdict
        return verdict if self.owner_asks() else {**verdict, "started_from_line": []}


class StatusHandler(GpuGovHandler):
    """The latest report of this server (docs/api.md, "The report"): devices, per-target GPU use, window.

    ``?refresh=1`` samples now instead of returning the last periodic sample.
    """

    @web.authenticated
    @authorized
    async def get(self):
        refresh = self.get_query_argument("refresh", "0").lower() in ("1", "true", "yes")
        try:
            report = await self.gpu_gov.latest_report(refresh=refresh)
        except NoSample as error:
            raise web.HTTPError(503, str(error)) from None
        verdict = report.get("verdict")
        shown = self.as_seen_by_asker(verdict)
        if shown is not verdict:
            report = {**report, "verdict": shown}
        self.set_header("Content-Type", "application/json")
        self.finish(browser_json.dumps(report))


def _body(handler: APIHandler) -> dict:
    try:
        data = json.loads(handler.request.body or b"{}")
    except ValueError as error:
        raise web.HTTPError(400, f"the body is not JSON: {error}") from None
    except RecursionError:  # not a ValueError: it was a 500
        raise web.HTTPError(
            400, "the body is not JSON this server reads: nested too deep"
        ) from None
    if not isinstance(data, dict):
        raise web.HTTPError(400, "the body must be a JSON object")
    return data


def _reason(reason) -> str:
    """A reason bounded as the governor bounds one: a checkpoint's goes into its manifest,
    which JupyterLab lists and the report carries (20 MB was once kept, and read back by every
    listing of the checkpoints)."""
    if not isinstance(reason, str):
        raise web.HTTPError(400, "'reason' must be a string")
    if refusal := reason_too_long(reason):
        raise web.HTTPError(400, refusal)
    return reason


class CheckpointHandler(GpuGovHandler):
    """``POST {"reason", "source", "cull_reason"}``: take a checkpoint now (kernel hooks of the
    kernels on a GPU, every open notebook, terminal scrollback); the governor asks before a
    cull, a user may ask too. Answers the manifest."""

    @web.authenticated
    @authorized
    async def post(self):
        body = _body(self)
        reason = _reason(body.get("reason") or "requested")
        source = body.get("source", SOURCE_USER)
        if source not in SOURCES:
            raise web.HTTPError(400, f"'source' must be one of {', '.join(SOURCES)}")
        cull_reason = body.get("cull_reason")
        if cull_reason is not None and cull_reason not in CULL_REASONS:
            raise web.HTTPError(
                400, f"'cull_reason' must be one of {', '.join(CULL_REASONS)} (or absent)"
            )
        await self._on_record(reason, source)
        try:
            manifest = await self.gpu_gov.checkpoint_on_request(reason, source, cull_reason)
        except Stopping:
            raise web.HTTPError(
                503, "the server is stopping: no checkpoint was completed"
            ) from None
        self.finish(browser_json.dumps(manifest))

    async def _on_record(self, reason: str, source: str) -> None:
        """Tell the governor who asked, before the checkpoint is taken, as Extend and Stop do
        (the asker's token where not the owner's): a guest's Checkpoint on a shared server was
        in no audit trail. ``source`` is the asker's word, so every ask is told, but the one
        that claims the governor's own checkpoint on offer (JupyterLab saving first: already
        on record as the governor's ``checkpoint``). The governor's refusal (the Hub knows no
        one by the token, or not as one who may use this server; a budget spent) refuses the
        checkpoint, nothing taken; a governor that does not answer holds back no one's save."""
        app = self.gpu_gov
        if app.reporter is None or app._frontend_first.open:
            return
        identity = app.server_identity
        try:
            status, outcome, retry_after = await app.reporter.checkpoint(
                identity["user"], identity["name"], reason, source, self.asker_token()
            )
        except Exception as error:
            status, outcome, retry_after = 599, {"message": str(error)}, 0.0
        if status in (400, 403, 429):
            if status == 429 and retry_after:
                self.set_header("Retry-After", str(math.ceil(retry_after)))
            message = str(outcome.get("message") or "")[:500]
            raise web.HTTPError(status, f"the governor refused the checkpoint: {message}")
        if status >= 300:
            self.log.warning(
                "jupyter-gpu-gov: a checkpoint asked is not on the governor's record (HTTP %s: %s)",
                status,
                str(outcome.get("message") or "")[:300],
            )


class CheckpointsHandler(GpuGovHandler):
    """``GET``: the checkpoints in ``GpuGovApp.checkpoint_dir``, newest first (summaries);
    ``GET …/<id>``: one checkpoint's manifest."""

    @web.authenticated
    @authorized
    async def get(self, checkpoint_id: str | None = None):
        root = Path(self.gpu_gov.checkpoint_dir)
        self.set_header("Content-Type", "application/json")
        if checkpoint_id is None:
            checkpoints = await asyncio.to_thread(list_checkpoints, root)
            self.finish(browser_json.dumps({"checkpoints": checkpoints}))
            return
        if not is_checkpoint_id(checkpoint_id):
            raise web.HTTPError(
                400, f"{checkpoint_id!r} is not a checkpoint id (YYYYMMDDTHHMMSSZ, maybe -n)"
            )
        manifest = await asyncio.to_thread(read_manifest, root, checkpoint_id)
        if manifest is None:
            raise web.HTTPError(404, f"no checkpoint {checkpoint_id} in {root}")
        self.finish(browser_json.dumps(manifest))


class ForwardHandler(GpuGovHandler):
    """``POST {"reason": …}``: forward the owner's request to the governor with this server's
    own token (``extend``: more time; ``stop``: give the GPU back now)."""

    def initialize(self, name: str, verb: str):
        super().initialize(name)
        self.verb = verb

    @web.authenticated
    @authorized
    async def post(self):
        reason = _reason(_body(self).get("reason", ""))
        app = self.gpu_gov
        if app.reporter is None:
            raise web.HTTPError(
                409, "this server does not report to a governor (GpuGovApp.governor_url)"
            )
        identity = app.server_identity
        call = app.reporter.extend if self.verb == "extend" else app.reporter.stop
        try:
            status, outcome, retry_after = await call(
                identity["user"], identity["name"], reason, self.asker_token()
            )
        except Exception as error:
            raise web.HTTPError(502, f"the governor did not answer: {error}") from None
        verdict = outcome.get("verdict")
        if status < 400 and not isinstance(verdict, dict):
            # What answered in the governor's place (a proxy's login page, a redirect) granted
            # nothing: passed on with its 200, JupyterLab said "Extension granted".
            what = str(outcome.get("message") or json.dumps(outcome))[:200]
            raise web.HTTPError(502, f"the answer (HTTP {status}) is not the governor's: {what}")
        if isinstance(verdict, dict):
            app.set_verdict(verdict)
            outcome = {**outcome, "verdict": self.as_seen_by_asker(verdict)}
        self.set_status(status)
        if status == 429 and retry_after:
            # The governor's wait, passed on: JupyterLab reads it here, not from the words.
            self.set_header("Retry-After", str(math.ceil(retry_after)))
        self.finish(browser_json.dumps(outcome))


def handlers(url_prefix: str = "/jupyter-gpu-gov") -> list[tuple[str, type]]:
    return [
        (rf"{url_prefix}/status", StatusHandler),
        (rf"{url_prefix}/checkpoint", CheckpointHandler),
        (rf"{url_prefix}/checkpoints/?", CheckpointsHandler),
        (rf"{url_prefix}/checkpoints/(?P<checkpoint_id>[^/]+)", CheckpointsHandler),
        (rf"{url_prefix}/extend", ForwardHandler, {"verb": "extend"}),
        (rf"{url_prefix}/stop", ForwardHandler, {"verb": "stop"}),
    ]
