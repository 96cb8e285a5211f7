"""The handshake that lets JupyterLab save before the governor's checkpoint
(server/frontend_first.py): an offer a frontend claims is answered by the frontend's checkpoint,
even past the grace; one nobody claims lapses; a failed checkpoint fails the governor's too."""

from __future__ import annotations

import asyncio

import pytest

from jupyter_gpu_gov.server.frontend_first import FrontendFirst

MANIFEST = {"status": "done", "saved_by_frontend_first": True}


def test_an_unclaimed_offer_lapses_after_the_grace_and_cannot_be_claimed_later():
    async def scenario():
        handshake, announced = FrontendFirst(), []
        answer = await handshake.offer("gpu-idle", "t0", 0.05, lambda: announced.append(1))
        return answer, announced, handshake.claim()

    assert asyncio.run(scenario()) == (None, [1], None)


def test_a_claim_answers_the_governor_with_the_frontends_manifest_and_its_reasons():
    async def scenario():
        handshake, claims = FrontendFirst(), []

        async def frontend_checkpoint():
            await asyncio.sleep(0.1)  # its hooks run past the grace: still waited for
            claims[0].settle(MANIFEST)
            handshake.release(claims[0])

        def announce():  # the frontend hears of it and asks for its own checkpoint
            claims.append(handshake.claim())
            tasks.append(asyncio.ensure_future(frontend_checkpoint()))

        tasks: list[asyncio.Future] = []
        answer = await handshake.offer("reclaim", "t1", 0.05, announce)
        await asyncio.gather(*tasks)
        return answer, claims[0].cull_reason, claims[0].requested_at

    assert asyncio.run(scenario()) == (MANIFEST, "reclaim", "t1")


def test_a_failed_frontend_checkpoint_fails_the_governors_request():
    async def scenario():
        handshake = FrontendFirst()

        def announce():
            claim = handshake.claim()
            claim.settle(error=OSError("disk full"))
            handshake.release(claim)

        await handshake.offer(None, None, 5.0, announce)

    with pytest.raises(OSError, match="disk full"):
        asyncio.run(scenario())
