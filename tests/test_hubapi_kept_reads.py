"""A listed server keeps only ``hubapi.STATE_READ`` of its spawner's state and
``hubapi.OPTIONS_READ`` of its ``user_options`` (10,000 servers' whole models were megabytes):
a reader of any other key would get None, silently, and decide on it. This guard reads the
package's source for every key read of a ``HubServer``'s ``spawner_state`` and
``user_options``, following them into the functions they are handed to, and fails naming the
key and the file where one is read that is not kept, or where the value goes somewhere it cannot
follow (a copy, a loop over its keys, a truth test: the kept mapping answers those otherwise)."""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field
from pathlib import Path

from python_source import parse

from jupyter_gpu_gov.hub.hubapi import OPTIONS_READ, STATE_READ

PACKAGE = Path(__file__).resolve().parents[1] / "jupyter_gpu_gov"
# A HubServer's attributes that hold what hubapi keeps of the Hub's model, and what it keeps.
KEPT = {"spawner_state": STATE_READ, "user_options": OPTIONS_READ}
# Modules that run inside the Hub: their ``user_options`` and ``state`` are JupyterHub's own
# Spawner's, whole; no HubServer reaches them (hub/ and profiles/ never import each other).
HUB_PROCESS = ("profiles", "hub_process.py", "hub/hubconfig.py")


@dataclass
class Module:
    name: str  # dotted
    path: Path
    tree: ast.Module
    parents: dict[ast.AST, ast.AST] = field(default_factory=dict)
    # a name the module imports -> (the module it comes from, its name there; None: a module)
    imported: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    constants: dict[str, str] = field(default_factory=dict)
    defs: dict[str, ast.AST] = field(default_factory=dict)  # module-level functions and classes

    def where(self, node: ast.AST) -> str:
        return f"{self.path.relative_to(PACKAGE.parent)}:{node.lineno}"


def _load() -> dict[str, Module]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "labextension" in path.relative_to(PACKAGE).parts:
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        module = modules[name] = Module(name, path, parse(path))
        package = name if parts[-1] == "__init__" else name.rpartition(".")[0]
        for node in ast.walk(module.tree):
            for child in ast.iter_child_nodes(node):
                module.parents[child] = node
        for node in module.tree.body:
            if isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                source = f"{base}.{node.module}" if node.level and node.module else node.module
                source = source or base
                for alias in node.names:
                    module.imported[alias.asname or alias.name] = (source, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    module.imported[alias.asname or alias.name.partition(".")[0]] = (
                        alias.name if alias.asname else alias.name.partition(".")[0],
                        None,
                    )
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                module.defs[node.name] = node
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = node.value
                for target in targets:
                    pairs = [(target, value)]
                    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
                        pairs = list(zip(target.elts, value.elts, strict=False))
                    for t, v in pairs:
                        if (
                            isinstance(t, ast.Name)
                            and isinstance(v, ast.Constant)
                            and isinstance(v.value, str)
                        ):
                            module.constants[t.id] = v.value
    return modules


class Reads:
    """The keys read of each kept attribute, and the uses this guard cannot follow."""

    def __init__(self, modules: dict[str, Module]):
        self.modules = modules
        self.keys: dict[str, dict[str, set[str]]] = {attr: {} for attr in KEPT}
        self.unfollowed: list[str] = []
        self._done: set[tuple[int, str, str]] = set()
        self._by_name: dict[str, list[tuple[Module, ast.AST, ast.ClassDef | None]]] = {}
        for module in modules.values():
            for node in ast.walk(module.tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    owner = module.parents[node]
                    cls = owner if isinstance(owner, ast.ClassDef) else None
                    self._by_name.setdefault(node.name, []).append((module, node, cls))
        # ``self.<attr> = Class(...)`` anywhere: the classes a ``self.<attr>.method(...)`` runs
        self._attr_classes: dict[str, list[tuple[Module, ast.ClassDef]]] = {}
        for module in modules.values():
            for node in ast.walk(module.tree):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                    made = self._class_of(module, node.value.func)
                    for target in node.targets:
                        if made is not None and _self_attribute(target):
                            self._attr_classes.setdefault(target.attr, []).append(made)

    # --- names and calls --------------------------------------------------------------------
    def _module_attr(self, module_name: str, name: str):
        """What ``name`` of module ``module_name`` is: (module, def) or a module, or None."""
        if f"{module_name}.{name}" in self.modules:
            return self.modules[f"{module_name}.{name}"]
        module = self.modules.get(module_name)
        return None if module is None else self._named(module, name)

    def _named(self, module: Module, name: str):
        """What ``name`` is in ``module``: (module, def) or a module, or None."""
        if name in module.defs:
            return module, module.defs[name]
        if name in module.imported:
            source, original = module.imported[name]
            return (
                self.modules.get(source)
                if original is None
                else self._module_attr(source, original)
            )
        return None

    def constant(self, module: Module, node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in module.constants:
                return module.constants[node.id]
            if node.id in module.imported:
                source, original = module.imported[node.id]
                found = self.modules.get(source)
                if found is not None and original in found.constants:
                    return found.constants[original]
        return None

    def _resolved(self, module: Module, node: ast.AST):
        """What a name or a module's name (``x``, ``m.x``) is in ``module``, as ``_named``."""
        if isinstance(node, ast.Name):
            return self._named(module, node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            outer = self._named(module, node.value.id)
            if isinstance(outer, Module):
                return self._module_attr(outer.name, node.attr)
        return None

    def _class_of(self, module: Module, func: ast.AST) -> tuple[Module, ast.ClassDef] | None:
        found = self._resolved(module, func)
        if isinstance(found, tuple) and isinstance(found[1], ast.ClassDef):
            return found
        return None

    def callees(self, module: Module, func: ast.AST) -> list[tuple[Module, ast.AST, bool]]:
        """The functions a call of ``func`` may run: (module, def, whether its first parameter
        is bound); by import where the call names one, else every method of that name."""
        if isinstance(func, ast.Name):
            found = self._named(module, func.id)
            if found is not None and not isinstance(found, Module):
                owner, node = found
                if isinstance(node, ast.ClassDef):
                    return []
                return [(owner, node, False)]
            return []
        if not isinstance(func, ast.Attribute):
            return []
        holder = func.value
        found = self._resolved(module, holder)
        if isinstance(found, Module):
            node = found.defs.get(func.attr)
            return [(found, node, False)] if node is not None else []
        if found is not None and isinstance(found[1], ast.ClassDef):
            for node in found[1].body:
                if (
                    isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                    and node.name == func.attr
                ):
                    return [(found[0], node, not _static(node))]
            return []
        if _self_attribute(holder) and holder.attr in self._attr_classes:
            return [
                (owner, node, not _static(node))
                for owner, cls in self._attr_classes[holder.attr]
                for node in cls.body
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and node.name == func.attr
            ]
        # ``obj.method(...)``: every method of the package by that name
        return [
            (m, node, cls is not None and not _static(node))
            for m, node, cls in self._by_name.get(func.attr, [])
        ]

    # --- following a value ------------------------------------------------------------------
    def follow_roots(self) -> None:
        for module in self.modules.values():
            relative = module.path.relative_to(PACKAGE).as_posix()
            if any(relative == h or relative.startswith(f"{h}/") for h in HUB_PROCESS):
                continue
            for node in ast.walk(module.tree):
                if (
                    isinstance(node, ast.Attribute)
                    and node.attr in KEPT
                    and isinstance(node.ctx, ast.Load)
                ):
                    self._use(module, _function_of(module, node), node, node.attr)
                elif (  # getattr(server, "spawner_state"): read the same way
                    isinstance(node, ast.Call)
                    and getattr(node.func, "id", None) == "getattr"
                    and len(node.args) >= 2
                    and self.constant(module, node.args[1]) in KEPT
                ):
                    attr = self.constant(module, node.args[1])
                    self._use(module, _function_of(module, node), node, attr)

    def _follow_name(self, module: Module, function: ast.AST, name: str, attr: str) -> None:
        if (id(function), name, attr) in self._done:
            return
        self._done.add((id(function), name, attr))
        for node in ast.walk(function):
            if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load):
                self._use(module, function, node, attr)

    def _use(self, module: Module, function: ast.AST | None, node: ast.AST, attr: str) -> None:
        """Record how the value ``node`` evaluates to (``attr`` of a server, or all of it) is used."""
        parent = module.parents[node]
        where = module.where(node)

        def key_read(key_node: ast.AST) -> None:
            key = self.constant(module, key_node)
            if key is None:
                self.unfollowed.append(f"{where}: {attr} read by a key that is not a constant")
            else:
                self.keys[attr].setdefault(key, set()).add(where)

        if isinstance(parent, ast.Subscript) and parent.value is node:
            if isinstance(parent.ctx, ast.Load):
                return key_read(parent.slice)
        elif isinstance(parent, ast.Attribute) and parent.value is node:
            call = module.parents[parent]
            if parent.attr == "get" and isinstance(call, ast.Call) and call.func is parent:
                return key_read(call.args[0])
        elif isinstance(parent, ast.Compare):
            if parent.left is node and all(isinstance(op, ast.Is | ast.IsNot) for op in parent.ops):
                if all(isinstance(c, ast.Constant) and c.value is None for c in parent.comparators):
                    return  # whether the token could read it: None either way
            elif parent.comparators == [node] and isinstance(parent.ops[0], ast.In | ast.NotIn):
                return key_read(parent.left)
        elif isinstance(parent, ast.BoolOp) and isinstance(parent.op, ast.Or):
            rest = parent.values[1:]
            if parent.values[0] is node and len(rest) == 1 and _empty_mapping(rest[0]):
                return self._use(module, function, parent, attr)  # ``state or {}``: the same keys
        elif (
            isinstance(parent, ast.Assign | ast.AnnAssign | ast.NamedExpr) and parent.value is node
        ):
            targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
            if function is not None and all(isinstance(t, ast.Name) for t in targets):
                for target in targets:
                    self._follow_name(module, function, target.id, attr)
                return
        elif isinstance(parent, ast.Call) and node in parent.args:
            if isinstance(parent.func, ast.Name) and parent.func.id == "isinstance":
                if parent.args[0] is node and _names_mapping(parent.args[1]):
                    return  # a Mapping, kept or whole (a dict's test would differ)
            elif self._into(module, parent, parent.args.index(node), None, attr, where):
                return
        elif isinstance(parent, ast.keyword) and parent.arg is not None:
            call = module.parents[parent]
            if self._into(module, call, None, parent.arg, attr, where):
                return
        code = ast.unparse(parent)
        self.unfollowed.append(f"{where}: {attr} used where this guard cannot follow: {code:.100}")

    def _into(self, module, call, index, keyword, attr, where) -> bool:
        """Follow a value handed to ``call`` into each function it may run; False if none."""
        callees = self.callees(module, call.func)
        if not callees or any(isinstance(a, ast.Starred) for a in call.args):
            return False
        for owner, function, bound in callees:
            arguments = function.args
            positional = [a.arg for a in arguments.posonlyargs + arguments.args][int(bound) :]
            if keyword is not None:
                names = positional + [a.arg for a in arguments.kwonlyargs]
                if keyword not in names:
                    return False
                param = keyword
            elif index < len(positional):
                param = positional[index]
            else:
                return False
            self._follow_name(owner, function, param, attr)
        return True


def _function_of(module: Module, node: ast.AST) -> ast.AST | None:
    while node in module.parents:
        node = module.parents[node]
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            return node
    return None


def _self_attribute(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "self"


def _static(function: ast.AST) -> bool:
    return any(getattr(d, "id", None) == "staticmethod" for d in function.decorator_list)


def _empty_mapping(node: ast.AST) -> bool:
    return (isinstance(node, ast.Dict) and not node.keys) or (
        isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dict" and not node.args
    )


def _names_mapping(node: ast.AST) -> bool:
    kinds = node.elts if isinstance(node, ast.Tuple) else [node]
    return all(getattr(k, "id", None) == "Mapping" for k in kinds)


@functools.cache
def kept_reads() -> Reads:
    reads = Reads(_load())
    reads.follow_roots()
    return reads


def test_every_key_read_of_a_listed_server_s_state_and_options_is_kept():
    reads = kept_reads()
    not_kept = [
        f"{where}: reads {attr}[{key!r}], which hubapi does not keep: add it to "
        f"hubapi.{'STATE_READ' if attr == 'spawner_state' else 'OPTIONS_READ'}"
        for attr, kept in KEPT.items()
        for key, wheres in sorted(reads.keys[attr].items())
        if key not in kept
        for where in sorted(wheres)
    ]
    unfollowed = [
        f"{line} (read its keys by constants: [...], .get(...), in; or hand it to a function "
        "of the package that does)"
        for line in reads.unfollowed
    ]
    assert not not_kept + unfollowed, "\n".join(not_kept + unfollowed)


def test_the_guard_sees_every_reader_of_what_is_kept():
    """Every key kept is one this guard finds read: a key kept that it does not find is either
    kept for nothing or read where the guard is blind (which the test above would then miss)."""
    reads = kept_reads()
    assert set(reads.keys["spawner_state"]) == set(STATE_READ)
    assert set(reads.keys["user_options"]) == set(OPTIONS_READ)
