"""jupyterhub-idle-culler's command line, accepted as it is written: the governor is a drop-in
replacement for ``python -m jupyterhub_idle_culler --timeout=3600 --cull-users ...``."""

from __future__ import annotations

# jupyterhub-idle-culler's command line, mapped onto our traits.
IDLE_CULLER_OPTIONS = {
    "timeout": "GpuGovernor.timeout",
    "cull-every": "GpuGovernor.cull_every",
    "max-age": "GpuGovernor.max_age",
    "cull-users": "GpuGovernor.cull_users",
    "remove-named-servers": "GpuGovernor.remove_named_servers",
    "concurrency": "GpuGovernor.concurrency",
    "api-page-size": "GpuGovernor.api_page_size",
    "cull-default-servers": "GpuGovernor.cull_default_servers",
    "cull-named-servers": "GpuGovernor.cull_named_servers",
    "cull-admin-users": "GpuGovernor.cull_admin_users",
    "ssl-enabled": "GpuGovernor.ssl_enabled",
    "internal-certs-location": "GpuGovernor.internal_certs_location",
    "url": "GpuGovernor.url",
}
BOOL_OPTIONS = {
    "cull-users",
    "remove-named-servers",
    "cull-default-servers",
    "cull-named-servers",
    "cull-admin-users",
    "ssl-enabled",
    "dry-run",
}


def normalise_argv(argv: list[str]) -> list[str]:
    """Accept jupyterhub-idle-culler's spellings: ``--cull-users`` as well as
    ``--cull-users=true``, and ``--cull_every`` as well as ``--cull-every``."""
    out = []
    for arg in argv:
        if arg.startswith("--") and "." not in arg.split("=", 1)[0]:
            name, eq, value = arg[2:].partition("=")
            name = name.replace("_", "-")
            arg = f"--{name}=true" if name in BOOL_OPTIONS and not eq else f"--{name}{eq}{value}"
        out.append(arg)
    return out
