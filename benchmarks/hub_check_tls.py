"""CPU per Hub token check under internal SSL: PreparedHubOAuth against a Hub API served over
real TLS (certificates made by certipy, as JupyterHub makes its internal ones; the Hub side asks
for the client certificate). `python -m benchmarks.hub_check_tls [N]` prints the process CPU ms per check for
N distinct tokens (each one a check). Run from a tree (before/after) with PYTHONPATH set."""

import asyncio
import ssl
import sys
import tempfile
import time

from certipy import Certipy
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from jupyter_gpu_gov.hub.prepared_auth import PreparedHubOAuth


async def main(n: int) -> None:
    certs = Certipy(store_dir=tempfile.mkdtemp())
    ca = certs.create_ca("hub-ca")["files"]["cert"]
    names = ["IP:127.0.0.1", "DNS:localhost"]
    hub_pair = certs.create_signed_pair("hub-internal", "hub-ca", alt_names=names)["files"]
    gov_pair = certs.create_signed_pair("gpu-gov", "hub-ca", alt_names=names)["files"]

    class User(web.RequestHandler):
        def get(self):
            token = self.request.headers.get("Authorization", "").removeprefix("token ")
            self.finish({"kind": "user", "name": token, "scopes": ["access:services"]})

    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca)
    server_side.load_cert_chain(hub_pair["cert"], hub_pair["key"])
    server_side.verify_mode = ssl.CERT_REQUIRED
    sock, port = bind_unused_port()
    hub = HTTPServer(web.Application([(r"/hub/api/user", User)]), ssl_options=server_side)
    hub.add_sockets([sock])
    auth = PreparedHubOAuth(
        api_token="secret",
        api_url=f"https://127.0.0.1:{port}/hub/api",
        certfile=gov_pair["cert"],
        keyfile=gov_pair["key"],
        client_ca=ca,
    )
    await auth.user_for_token("warm", sync=False)
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(n):
        assert (await auth.user_for_token(f"t{i}", sync=False))["name"] == f"t{i}"
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(f"{n} checks: {1000 * cpu / n:.2f} ms CPU, {1000 * wall / n:.2f} ms wall per check")
    hub.stop()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 200))
