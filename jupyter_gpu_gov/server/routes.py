"""REST routes of the server extension, under ``/jupyter-gpu-gov/``."""

from __future__ import annotations

import json

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web

AUTH_RESOURCE = "gpu-gov"


class GpuGovHandler(ExtensionHandlerMixin, APIHandler):
    auth_resource = AUTH_RESOURCE

    @property
    def gpu_gov(self):
        return self.extensionapp


class StatusHandler(GpuGovHandler):
    """The latest DESIGN §5 report of this server: devices, per-target GPU use, window.

    ``?refresh=1`` samples now instead of returning the last periodic sample.
    """

    @web.authenticated
    @authorized
    async def get(self):
        refresh = self.get_query_argument("refresh", "0").lower() in ("1", "true", "yes")
        report = await self.gpu_gov.latest_report(refresh=refresh)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(report))


def handlers(url_prefix: str = "/jupyter-gpu-gov") -> list[tuple[str, type]]:
    return [(rf"{url_prefix}/status", StatusHandler)]
