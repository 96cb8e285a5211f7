"""jupyter-gpu-gov: GPU governance for JupyterHub.

Import-light on purpose: the same wheel lands in the hub image and the single-user image, so
nothing heavy (tornado, jupyter_server, jupyterhub, pynvml) is imported here.
"""

from ._version import __version__


def _jupyter_server_extension_points():
    from .server.app import GpuGovApp

    return [{"module": "jupyter_gpu_gov.server.app", "app": GpuGovApp}]


def _jupyter_labextension_paths():
    return [{"src": "labextension", "dest": "jupyter-gpu-gov"}]


__all__ = ["__version__"]
