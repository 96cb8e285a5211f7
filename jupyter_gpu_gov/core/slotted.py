"""Instances of frozen, slotted dataclasses made without a call a field.

Slots, not a ``__dict__`` each, for what the governor keeps per server or per GPU (about a
third less: docs/benchmarks-history.md, "Issue 26, wave 43: the service's memory"). A frozen
dataclass's ``__init__`` sets each field with ``object.__setattr__`` (a call a field); here the
instance is made as one of a plain class with the same slots, each field set by the
interpreter's own slot store, then given the frozen class (the same layout: Python allows the
change of ``__class__``). The code is generated from the dataclass's field names alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from typing import Any


class WeakReferable:
    """The base of a slotted dataclass that is referred to weakly. Not ``weakref_slot=True``:
    Python refuses a class with that slot after the others for ``__class__`` (its layout check
    counts the slot's place only where no other slot comes before it); here it comes first."""

    __slots__ = ("__weakref__",)


def _blank(cls: type) -> type:
    names = tuple(f.name for f in fields(cls))
    if getattr(cls, "__slots__", None) != names or cls.__bases__ not in (
        (object,),
        (WeakReferable,),
    ):
        raise TypeError(f"{cls.__name__} is not a slotted dataclass of object or WeakReferable")
    return type(f"_{cls.__name__}Fields", cls.__bases__, {"__slots__": names})


def _compiled(cls: type, signature: str, body: list[str]) -> Callable:
    scope = {"new": object.__new__, "blank": _blank(cls), "cls": cls}
    source = "\n".join([f"def made({signature}):", "    made = new(blank)", *body])
    exec(source, scope)  # the names are the dataclass's own fields, nothing else
    return scope["made"]


def copier(cls: type) -> Callable[[Any, Mapping[str, Any]], Any]:
    """``copy(obj, changes)``: ``dataclasses.replace(obj, **changes)`` without ``__init__``
    (no ``__post_init__`` runs); a name that is no field raises TypeError."""
    names = [f.name for f in fields(cls)]
    return _compiled(
        cls,
        "obj, changes",
        [
            *(f"    made.{name} = obj.{name}" for name in names),
            "    for name, value in changes.items():",
            "        try:",
            "            setattr(made, name, value)",
            "        except AttributeError:",
            "            raise TypeError(f'{cls.__name__} has no field {name!r}') from None",
            "    made.__class__ = cls",
            "    return made",
        ],
    )


def builder(cls: type) -> Callable[[Iterable[Any]], Any]:
    """``build(values)``: an instance with these values, one a field in their order (as many
    as the fields, else ValueError), without ``__init__``."""
    names = [f.name for f in fields(cls)]
    targets = ", ".join(f"made.{name}" for name in names)
    return _compiled(
        cls,
        "values",
        [f"    ({targets},) = values", "    made.__class__ = cls", "    return made"],
    )


def equality(cls: type) -> Callable[[Any, Any], bool]:
    """``same(a, b)``: every field of ``a`` equal to ``b``'s, as a tuple of them compares (an
    object is equal to itself), read by the interpreter's slot load, not a call a field."""
    names = [f.name for f in fields(cls)]
    test = " and ".join(f"(a.{name} is b.{name} or a.{name} == b.{name})" for name in names)
    scope: dict[str, Any] = {}
    exec(f"def same(a, b):\n    return bool({test})", scope)  # the dataclass's own fields
    return scope["same"]
