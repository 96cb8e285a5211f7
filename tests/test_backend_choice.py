"""Backend ``auto`` on a machine with GPU device files and no working NVML: a loud warning and
"unavailable" (unknown, never idle), not a silent "no GPU"."""

from __future__ import annotations

import logging
import sys

from fake_pynvml import FakeGpu, install

from jupyter_gpu_gov.gpu.backends import NoGpuBackend, make_backend
from jupyter_gpu_gov.gpu.nvml import NvmlBackend


def test_gpu_device_files_without_nvidia_ml_py_read_unavailable_and_say_so(
    tmp_path, monkeypatch, caplog
):
    (tmp_path / "nvidia0").touch()
    (tmp_path / "nvidiactl").touch()  # not a GPU: not named
    monkeypatch.setitem(sys.modules, "pynvml", None)  # a plain install without the bindings
    with caplog.at_level(logging.WARNING, logger="jupyter_gpu_gov"):
        backend = make_backend("auto", device_files=str(tmp_path / "nvidia[0-9]*"))
    try:
        assert isinstance(backend, NvmlBackend)
        snap = backend.sample()
        assert snap.backend == "unavailable" and "nvidia-ml-py" in snap.error
    finally:
        backend.close()
    (record,) = caplog.records
    assert "HAS GPUS" in record.message and "nvidia0" in record.message
    assert "nvidiactl" not in record.message and "nvidia-ml-py" in record.message


def test_a_machine_without_gpus_reads_none_quietly(tmp_path, monkeypatch, caplog):
    fake = install(monkeypatch, FakeGpu("GPU-a"))
    fake.library_present = False  # no driver at all, and no device files
    with caplog.at_level(logging.WARNING, logger="jupyter_gpu_gov"):
        backend = make_backend("auto", device_files=str(tmp_path / "nvidia[0-9]*"))
    assert isinstance(backend, NoGpuBackend) and backend.sample().backend == "none"
    assert caplog.records == []


def test_backend_up_reads_0_without_a_gpu_backend():
    """A server without GPUs (backend none) has no GPU backend up: alerts on backend_up == 0
    select backend!="none" to leave CPU-only servers out."""
    from prometheus_client import REGISTRY

    from jupyter_gpu_gov.server import metrics

    def up():
        return {
            s.labels["backend"]: s.value
            for f in REGISTRY.collect()
            if f.name == "jupyter_gpu_gov_backend_up"
            for s in f.samples
        }

    for backend, value in (("none", 0.0), ("unavailable", 0.0), ("nvml", 1.0)):
        metrics.update({"backend": backend, "devices": [], "targets": []}, 0.0, 0.0)
        assert up() == {backend: value}
