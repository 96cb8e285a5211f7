"""The service's CPU for one token check with the Hub: what a report costs when HubAuth has no
answer cached (a server's first report, then one in six: ``cache_max_age`` 300 s, a report every
60 s).

    python -m benchmarks.hub_check [--checks 1000] [--rounds 3] [--event-loop auto|uvloop|asyncio]

The fake Hub runs in its own process (``benchmarks.ingest``'s, with its users' tokens); this
process asks it who each of ``--checks`` tokens belongs to, one after another, on the event loop
the service would run (``hub/event_loop.py``), and reads this thread's CPU
(``time.thread_time``: the Hub's work and other work on the machine do not count). Two ways:

- ``hubauth``: the service's own path, ``PreparedHubOAuth.user_for_token(token, sync=False)``
  uncached (what ``prepared_auth.asked_token_caller`` awaits): JupyterHub's ``HubAuth``, its
  shared ``aiohttp`` session, the kept model;
- ``raw``: the same ``GET <api>/user`` on one kept connection with asyncio streams, the answer's
  head read by hand and its body by ``json.loads``: about the least a Python client can spend,
  for comparison only (no TLS, no timeouts, no errors handled).

Per report, a check costs its figure over ``EXPIRED_EVERY`` (6) reports at the steady rate
(docs/benchmarks-history.md, "Issue 26, wave 21").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from urllib.parse import urlparse

from .ingest import EXPIRED_EVERY, fake_hub, token_for

SETTLE = 20  # checks before timing: the connection opened, the code warm


async def _hubauth(ready: dict, users: list[str], rounds: int) -> list[float]:
    from jupyter_gpu_gov.hub.prepared_auth import PreparedHubOAuth

    auth = PreparedHubOAuth(api_url=ready["api_url"], api_token=ready["token"])
    for user in users[:SETTLE]:
        await auth.user_for_token(token_for(user, 0), use_cache=False, sync=False)
    out = []
    for _ in range(rounds):
        started = time.thread_time()
        for user in users:
            model = await auth.user_for_token(token_for(user, 0), use_cache=False, sync=False)
            assert model["name"] == user, model
        out.append((time.thread_time() - started) / len(users) * 1e6)
    return out


async def _raw(ready: dict, users: list[str], rounds: int) -> list[float]:
    url = urlparse(ready["api_url"])
    path = url.path.rstrip("/") + "/user"
    reader, writer = await asyncio.open_connection(url.hostname, url.port)

    async def check(token: str) -> dict:
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Authorization: token {token}\r\n\r\n".encode()
        )
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        return json.loads(await reader.readexactly(length))

    try:
        for user in users[:SETTLE]:
            await check(token_for(user, 0))
        out = []
        for _ in range(rounds):
            started = time.thread_time()
            for user in users:
                model = await check(token_for(user, 0))
                assert model["name"] == user, model
            out.append((time.thread_time() - started) / len(users) * 1e6)
        return out
    finally:
        writer.close()


def run(checks: int = 1000, rounds: int = 3, event_loop: str = "auto") -> dict:
    """Median µs of this thread's CPU a check, each way, and a report's share at the steady
    rate (one report in ``EXPIRED_EVERY`` is checked)."""
    from jupyter_gpu_gov.hub.event_loop import loop_factory

    factory = loop_factory(event_loop)
    with fake_hub(checks, 60) as ready:
        users = ready["users"][:checks]
        with asyncio.Runner(loop_factory=factory) as runner:
            hubauth = runner.run(_hubauth(ready, users, rounds))
            raw = runner.run(_raw(ready, users, rounds))
    out: dict = {"checks": len(users), "rounds": rounds, "event_loop": event_loop}
    for name, values in (("hubauth", hubauth), ("raw", raw)):
        median = statistics.median(values)
        out[f"{name}_us"] = round(median)
        out[f"{name}_us_runs"] = "/".join(f"{v:.0f}" for v in values)
        out[f"{name}_us_per_report"] = round(median / EXPIRED_EVERY, 1)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checks", type=int, default=1000, help="tokens checked a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--event-loop", default="auto", choices=("auto", "uvloop", "asyncio"))
    args = parser.parse_args(argv)
    result = run(args.checks, args.rounds, args.event_loop)
    print("hub_check:", " ".join(f"{k}={v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
