"""``jupyterhub_config.py`` is Python, and admins set things anywhere in it: what
``add_governor`` and ``add_gpu_profiles`` add to ``c`` reads what ``c`` holds so far, as
traitlets keeps it (a list, or a lazy ``.append``/``.update`` not yet applied), and keeps an
admin's own values. The Hub side of it (adding again to the Hub's whole configuration, and
bounding ``user_options`` where the Hub stores them) is adapter code: ``hub_process.py``.
"""

from __future__ import annotations

from traitlets.config import LazyConfigValue


def listed(value) -> list:
    """The items of a list setting as ``c`` holds it: a list, or traitlets' lazy value that
    ``c.X.y.append``/``extend``/``prepend``/``insert`` made (read without ``get_value``, which
    would keep the result and drop later appends)."""
    if isinstance(value, LazyConfigValue):
        return [*value._prepend, *(item for _, item in value._inserts), *value._extend]
    return list(value or ())


def updated(value: LazyConfigValue) -> dict:
    """What ``c.X.y.update(...)`` has set so far on a dict setting traitlets holds lazily."""
    pending = value._update
    return pending if isinstance(pending, dict) else {}
