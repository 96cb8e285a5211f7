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
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(report))


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
        try:
            manifest = await self.gpu_gov.checkpoint_on_request(reason, source, cull_reason)
        except Stopping:
            raise web.HTTPError(
                503, "the server is stopping: no checkpoint was completed"
            ) from None
        self.finish(json.dumps(manifest))


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
            self.finish(json.dumps({"checkpoints": checkpoints}))
            return
        if not is_checkpoint_id(checkpoint_id):
            raise web.HTTPError(
                400, f"{checkpoint_id!r} is not a checkpoint id (YYYYMMDDTHHMMSSZ, maybe -n)"
            )
        manifest = await asyncio.to_thread(read_manifest, root, checkpoint_id)
        if manifest is None:
            raise web.HTTPError(404, f"no checkpoint {checkpoint_id} in {root}")
        self.finish(json.dumps(manifest))


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
                identity["user"], identity["name"], reason, self._asker_token(identity["user"])
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
        self.set_status(status)
        if status == 429 and retry_after:
            # The governor's wait, passed on: JupyterLab reads it here, not from the words.
            self.set_header("Retry-After", str(math.ceil(retry_after)))
        self.finish(json.dumps(outcome))

    def _asker_token(self, owner: str) -> str | None:
        """The token the person asking sent this server (header, URL or the login's cookie),
        where they are not its owner: a guest of a shared server, or an admin. Sent on with the
        ask, the governor puts that person on record, as the Hub says the token is theirs and
        reaches this server; forwarded with this server's token alone, bob's Stop on alice's
        shared server was audited as alice's. None: the owner asked (the server's token says
        so), or no Hub login (no one else can reach the server). A Hub service named as the
        owner is not the owner (the Hub names services and users apart)."""
        hub_auth = getattr(self.identity_provider, "hub_auth", None)
        user = self.current_user
        kind = (getattr(user, "hub_user", None) or {}).get("kind", "user")
        if hub_auth is None or (kind == "user" and getattr(user, "username", owner) == owner):
            return None
        return hub_auth.get_token(self) or None


def handlers(url_prefix: str = "/jupyter-gpu-gov") -> list[tuple[str, type]]:
    return [
        (rf"{url_prefix}/status", StatusHandler),
        (rf"{url_prefix}/checkpoint", CheckpointHandler),
        (rf"{url_prefix}/checkpoints/?", CheckpointsHandler),
        (rf"{url_prefix}/checkpoints/(?P<checkpoint_id>[^/]+)", CheckpointsHandler),
        (rf"{url_prefix}/extend", ForwardHandler, {"verb": "extend"}),
        (rf"{url_prefix}/stop", ForwardHandler, {"verb": "stop"}),
    ]
