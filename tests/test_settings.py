"""The governor's settings and the frozen ``Options`` its parts read (docs/architecture.md,
"Configuration"): a setting nothing reads, an option nothing sets or reads, or defaults that
disagree between the two fail here — the drift that once left ``concurrency`` set and unread."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from python_source import parse

from jupyter_gpu_gov.hub.app import GpuGovernor
from jupyter_gpu_gov.hub.diagnosis import DiagnosisOptions
from jupyter_gpu_gov.hub.health import HealthOptions
from jupyter_gpu_gov.hub.options import Options
from jupyter_gpu_gov.hub.settings import GovernorSettings

HUB = Path(__file__).resolve().parents[1] / "jupyter_gpu_gov" / "hub"


def test_every_setting_is_read_by_the_service():
    """Each ``c.GpuGovernor.*`` setting is read where the service builds its parts."""
    source = (HUB / "app.py").read_text(encoding="utf-8")
    unread = [
        name
        for name in GovernorSettings.class_trait_names(config=True)
        if not re.search(rf"\bself\.{name}\b", source)
    ]
    assert not unread, f"settings hub/app.py never reads: {unread}"


def _keywords(call_name: str) -> set[str]:
    """The keywords ``make_options`` passes to ``call_name(...)``."""
    tree = parse(HUB / "app.py")
    (method,) = [n for n in ast.walk(tree) if getattr(n, "name", None) == "make_options"]
    calls = [
        n
        for n in ast.walk(method)
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == call_name
    ]
    return {k.arg for call in calls for k in call.keywords}


def test_every_option_is_set_from_a_setting_and_read_by_a_part():
    """No option is left to its dataclass default by ``make_options`` (a setting forgotten),
    and every option is read by some part of the governor (none set and never read)."""
    sources = {
        path.name: path.read_text(encoding="utf-8")
        for path in HUB.glob("*.py")
        if path.name not in ("app.py", "settings.py")
    }
    for cls in (Options, DiagnosisOptions, HealthOptions):
        fields = {f.name for f in dataclasses.fields(cls)}
        assert fields == _keywords(cls.__name__), cls.__name__
        unread = [
            name
            for name in fields
            if not any(re.search(rf"\.{name}\b", text) for text in sources.values())
        ]
        assert not unread, f"{cls.__name__} fields no part reads: {unread}"


def test_the_options_defaults_are_the_settings_defaults(monkeypatch):
    """A governor built with no configuration gets the options tests build with ``Options()``:
    the two sets of defaults never tell different stories."""
    for name in ("JUPYTER_GPU_GOV_TIERS", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)
    app = GpuGovernor()
    app.initialize([])
    assert app.make_options() == Options()
