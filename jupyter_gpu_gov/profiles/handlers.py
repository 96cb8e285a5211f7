"""The spawn form's memory estimate, served by the hub at ``/hub/gpu-gov/estimate``.

``GET ?params=7B&precision=bf16&mode=training[&team=vision]`` → ``{"tier": "h100", "gb": 78.4,
"message": …}`` for a logged-in user, among the tiers of ``team`` (all tiers without one; ``tier``
is null when none fits). Bad input answers 400 with a message naming the parameter.

An API as much as the form's: a script or a notebook asks it with a Hub token of the user's
(``Authorization: token …``), no scope needed, as JupyterHub's own ``GET /hub/api/user`` (it
reads nothing about anyone: the hub's tiers and arithmetic). A token the Hub does not accept
is a 403 in JSON, not the login page's redirect.
"""

from __future__ import annotations

from jupyterhub.handlers import BaseHandler
from tornado import web

from ..core import browser_json
from ..core.text import in_sentence
from .config import GpuProfiles
from .estimate import estimate_memory, smallest_tier


class EstimateHandler(BaseHandler):
    # A page handler takes only the login cookie (JupyterHub 2+): a script's token was sent
    # to the login page. Token authentication skips the XSRF check, as for the Hub's API.
    _accept_token_auth = True

    def get(self):
        if self.current_user is None and self.get_auth_token():
            self.set_status(403)
            self._json({"tier": None, "message": "the token is not one the Hub accepts"})
            return
        self._estimate()

    @web.authenticated
    def _estimate(self):
        try:
            estimate = estimate_memory(
                self.get_argument("params", ""),
                self.get_argument("precision", "bf16"),
                self.get_argument("mode", "inference"),
            )
        except ValueError as error:
            self.set_status(400)
            self._json({"tier": None, "message": str(error)})
            return
        conf = GpuProfiles.instance(config=self.config)
        tiers = conf.tier_map
        quota = conf.quota_map.get(self.get_argument("team", ""))
        if quota is not None:  # the tiers of the team chosen on the form
            tiers = {name: tier for name, tier in tiers.items() if name in quota.tiers}
        tier = smallest_tier(estimate, tiers)
        need = f"About {estimate.gb:.1f} GB of GPU memory ({estimate.mode}, {estimate.precision})"
        message = (
            f"{need}: {in_sentence(tier.display_name)} ({in_sentence(tier.summary)}) is the smallest "
            "tier that fits."
            if tier
            else f"{need}: no tier here has that much; ask your admin, or shard the model."
        )
        self._json(
            {"tier": tier.name if tier else None, "gb": round(estimate.gb, 2), "message": message}
        )

    def _json(self, body: dict) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(browser_json.dumps(body))
