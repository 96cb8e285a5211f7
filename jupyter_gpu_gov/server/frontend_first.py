"""The handshake that lets a connected JupyterLab save its documents before the governor's
checkpoint (docs/api.md, "What a checkpoint does").

The governor's checkpoint is *offered* to the frontend (the verdict says ``checkpoint:
requested``); the frontend saves its dirty documents and asks for a checkpoint itself, which
*claims* the offer: its manifest answers the governor's request, with the governor's
``cull_reason`` and ``requested_at``. An offer nobody claims within the grace lapses, and the
server checkpoints alone. All of that state lives here, in one object per server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Claim:
    """A frontend's checkpoint that answers the governor's offer."""

    answer: asyncio.Future  # the governor's side waits on it for the manifest
    cull_reason: str | None
    requested_at: str | None

    def settle(self, manifest: dict | None = None, error: BaseException | None = None) -> None:
        """Give the governor's side the manifest, or the error the checkpoint ended with."""
        if self.answer.done():
            return
        if isinstance(error, asyncio.CancelledError):
            self.answer.cancel()
        elif error is not None:
            self.answer.set_exception(error)
        else:
            self.answer.set_result(manifest)


class FrontendFirst:
    """One server's offers of the governor's checkpoints to its frontend."""

    def __init__(self) -> None:
        self._offer: Claim | None = None  # open: a frontend may still claim it
        self._claimed: Claim | None = None  # claimed, its checkpoint under way

    async def offer(
        self,
        cull_reason: str | None,
        requested_at: str | None,
        grace: float,
        announce: Callable[[], None],
    ) -> dict | None:
        """Offer the governor's checkpoint (``announce`` tells the frontend) and answer the
        manifest of the frontend's checkpoint; None when no frontend claimed it within
        ``grace`` seconds. A claim made in time is waited for past the grace (its hooks run)."""
        offer = Claim(asyncio.get_running_loop().create_future(), cull_reason, requested_at)
        self._offer = offer
        announce()
        try:
            return await asyncio.wait_for(asyncio.shield(offer.answer), grace)
        except asyncio.TimeoutError:
            if self._claimed is offer:
                return await offer.answer
            return None
        finally:
            self._offer = None

    @property
    def open(self) -> bool:
        """Whether the governor's checkpoint is on offer: a checkpoint asked now claims it."""
        return self._offer is not None

    def claim(self) -> Claim | None:
        """The open offer, now claimed by the checkpoint the frontend asked for; None if none."""
        offer = self._offer
        if offer is not None:
            self._claimed = offer
        return offer

    def release(self, claim: Claim | None) -> None:
        """The claimed checkpoint ended (settle it first)."""
        if claim is not None and self._claimed is claim:
            self._claimed = None
