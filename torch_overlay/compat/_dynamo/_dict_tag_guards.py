"""Recursive dict-tag guards for torch 2.7.1: the backport of upstream's
``torch._dynamo.config.use_recursive_dict_tags_for_guards``.

Backport only (the compat layer, never exported): upstream marks tag-safe
subtrees in its C++ guard manager, which torch 2.7.1's cannot be rebuilt to do.
Here the subtree of each tag-safe ``nn.Module`` is built under a guard manager
of its own, and the tree gets one guard in its place, a
``torch._dynamo._dict_tag_guards_C.DictTagGuard`` (a lambda guard whose fast path
is C). ``CheckFunctionManager`` calls :func:`find_tag_safe_roots` on a guard
tree it built and, when it names any, builds the guards again with those
subtrees apart (:class:`DictTagSubtrees`), on a fresh compile and on a load alike.
"""

# NOTE: [Recursive dict tags on torch 2.7.1]
# A deep model's guards mostly walk its module tree: each submodule's type, its
# __dict__, the _modules and _parameters dicts, a few attribute values and the
# parameters' tensor guards. Torch 2.7.1 already skips a tensor (or an int, a
# float...) held by a dict whose version tag did not change since the last check
# that passed (config.skip_tensor_guards_with_matching_dict_tags), but still walks
# every module. Upstream (pytorch#159183 and follow-ups) extends that skip to whole
# subtrees: an nn.Module whose guarded subtree reads only dicts, module
# __dict__s, immutable values and tensors is a "tag-safe root", and while every
# dict of its subtree keeps its version tag the subtree's guards are not run.
#
# The backport, for 2.7.1's guard manager, which has no such skip:
#   1. CheckFunctionManager builds the guard tree as usual; find_tag_safe_roots
#      reads its shape (the leaf guard types of each node and how each child is
#      reached) and picks the highest module nodes whose whole subtree is made of
#      GetGenericDict / DictGetItem / dict key and value / TupleGetItem / Type
#      accessors and of leaf guards whose answer is fixed while those dicts are
#      (ALLOWED_LEAF_GUARDS; tensor guards only on nodes without accessors, as
#      2.7.1's own skip requires).
#   2. The guards are built again with each root's sources under a RootGuardManager
#      of its own (GuardBuilder redirects them), and the root's node in the tree
#      gets a DictTagGuard.
#   3. A DictTagGuard whose snapshot matches answers True in C (NOTE: [What a
#      dict-tag snapshot compares] in compat/csrc/dict_tag_guards.cpp). Otherwise
#      it runs the subtree's own guards; when they pass it records a snapshot
#      from the values the subtree reaches, one per root object (a layer's
#      compiled forward sees every layer), at most
#      config.max_saved_pointers_for_recursive_dict_tags_check of them, as
#      upstream. Recording checks what the shape could not: an EQUALS_MATCH value
#      is immutable, a LENGTH_CHECK reads a tuple, a dict or a container module's
#      _modules, the root can be weakly referenced. A subtree that fails those,
#      or records MAX_RECORDS times more than it has root objects (its dicts
#      change between calls), stops recording and runs its guards on every call.
# Failure reasons name the subtree's guard that failed (subtree_failure).
#
# What the snapshot cannot see, as upstream: a tensor changed in place (2.7.1's
# one-level skip ignores that too), and a class attribute rebound on a module's
# type. An object's __class__ assignment is seen (TYPE entries).

from __future__ import annotations

import ast
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch._C._dynamo.guards import (
    DictGetItemGuardAccessor,
    DictGuardManager,
    GetGenericDictGuardAccessor,
    GuardManager,
    RootGuardManager,
    TupleGetItemGuardAccessor,
    TypeGuardAccessor,
)


log = logging.getLogger(__name__)

# Leaf guards whose answer is fixed while the dicts of their subtree keep their
# tags (given the checks made when recording).
ALLOWED_LEAF_GUARDS = frozenset(
    {
        "TYPE_MATCH",
        "ID_MATCH",
        "EQUALS_MATCH",
        "LENGTH_CHECK",
        "DICT_LENGTH",
        "DICT_CONTAINS",
        "DICT_VERSION",
        "NOT_NONE",
        "TENSOR_MATCH",
    }
)
# Records one subtree may make beyond one per root object before it stops: past
# that its dicts change between calls and recording costs more than it saves.
MAX_RECORDS = 32
# The verbose code part of a DictTagGuard (one per subtree root).
GUARD_PART = "___dict_tags_unchanged({source})"

_IMMUTABLE_TYPES = (
    int,
    float,
    complex,
    bool,
    str,
    bytes,
    type(None),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
)
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE
_CONTAINER_MODULES = (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict)


def _is_immutable(value: object) -> bool:
    if isinstance(value, (tuple, frozenset)):
        return all(_is_immutable(v) for v in value)
    return isinstance(value, _IMMUTABLE_TYPES)


class _Unsafe(Exception):
    """A recorded value breaks what a snapshot relies on."""


# --- the shape of a guard tree ------------------------------------------------

# A child of a node: how its value is reached from its parent's, and its manager.
#   ("__dict__", None), ("item", key), ("key_at", i), ("value_at", i),
#   ("tuple_item", i), ("type", None)
Step = tuple[str, object]


def _accessor_arg(accessor: object) -> object:
    text = accessor.repr()  # type: ignore[attr-defined]
    return ast.literal_eval(text[text.index("(") + 1 : -1])


def _children(mgr: GuardManager) -> Optional[list[tuple[Step, GuardManager]]]:
    """The node's children with their steps; None when one is reached some other
    way (that subtree is not tag safe)."""
    out: list[tuple[Step, GuardManager]] = []
    for accessor, child in zip(mgr.get_accessors(), mgr.get_child_managers()):
        try:
            if isinstance(accessor, GetGenericDictGuardAccessor):
                out.append((("__dict__", None), child))
            elif isinstance(accessor, DictGetItemGuardAccessor):
                out.append((("item", _accessor_arg(accessor)), child))
            elif isinstance(accessor, TupleGetItemGuardAccessor):
                out.append((("tuple_item", _accessor_arg(accessor)), child))
            elif isinstance(accessor, TypeGuardAccessor):
                out.append((("type", None), child))
            else:
                return None
        except (ValueError, SyntaxError):
            return None  # a key whose repr is not a literal
    if isinstance(mgr, DictGuardManager):
        for index, (key_mgr, value_mgr) in sorted(mgr.get_key_value_managers().items()):
            if key_mgr is not None:
                out.append((("key_at", index), key_mgr))
            if value_mgr is not None:
                out.append((("value_at", index), value_mgr))
    return out


def _leaf_types(mgr: GuardManager) -> frozenset[str]:
    return frozenset(type(leaf).__name__ for leaf in mgr.get_leaf_guards())


@dataclass
class _Shape:
    safe: bool
    roots: list[str] = field(default_factory=list)


def _visit(mgr: GuardManager) -> _Shape:
    children = _children(mgr)
    if children is None:  # not tag safe; roots may lie below
        others = list(mgr.get_child_managers())
        if isinstance(mgr, DictGuardManager):
            others += [
                m for kv in mgr.get_key_value_managers().values() for m in kv if m
            ]
        roots = [r for child in others for r in _visit(child).roots]
        return _Shape(False, roots)
    leaves = _leaf_types(mgr)
    kids = [(step, _visit(child), child) for step, child in children]
    roots = [r for _, shape, _ in kids for r in shape.roots]
    safe = (
        leaves <= ALLOWED_LEAF_GUARDS
        and all(shape.safe for _, shape, _ in kids)
        and not ("TENSOR_MATCH" in leaves and children)
        and (
            "TENSOR_MATCH" not in leaves
            or torch._dynamo.config.skip_tensor_guards_with_matching_dict_tags
        )
    )
    is_object = any(step[0] == "__dict__" for step, _, _ in kids)
    if safe and is_object:
        roots = [mgr.get_source()]
    return _Shape(safe, roots)


def find_tag_safe_roots(root: RootGuardManager) -> list[str]:
    """Source names of the tag-safe roots of a built guard tree: the highest
    module nodes whose whole subtree is tag safe."""
    return _visit(root).roots


# --- one subtree ---------------------------------------------------------------


@dataclass
class _Plan:
    """What recording reads at one node."""

    leaves: frozenset[str]
    children: list[tuple[Step, _Plan]]


def _plan(mgr: GuardManager) -> _Plan:
    children = _children(mgr)
    assert children is not None, "a tag-safe subtree reaches every child by a step"
    return _Plan(_leaf_types(mgr), [(step, _plan(child)) for step, child in children])


def _step(value: Any, step: Step) -> Any:
    kind, arg = step
    if kind == "__dict__":
        return object.__getattribute__(value, "__dict__")
    if kind == "item":
        return dict.__getitem__(value, arg)
    if kind == "key_at":
        return list(dict.keys(value))[arg]  # type: ignore[index]
    if kind == "value_at":
        return list(dict.values(value))[arg]  # type: ignore[index]
    if kind == "tuple_item":
        return tuple.__getitem__(value, arg)  # type: ignore[arg-type]
    return type(value)


def _record(
    plan: _Plan, value: Any, out: list[tuple[str, object]], reached_by: str
) -> None:
    leaves = plan.leaves
    if "TENSOR_MATCH" in leaves:
        if not isinstance(value, torch.Tensor):
            raise _Unsafe("TENSOR_MATCH on a non-tensor")
        return  # held by a recorded dict; 2.7.1's own skip rules apply
    if "EQUALS_MATCH" in leaves and not _is_immutable(value):
        raise _Unsafe(f"EQUALS_MATCH on a {type(value).__name__}")
    if leaves & {"DICT_LENGTH", "DICT_CONTAINS", "DICT_VERSION"} and not isinstance(
        value, dict
    ):
        raise _Unsafe("a dict guard on a non-dict")
    if "TYPE_MATCH" in leaves and type(value).__flags__ & _HEAPTYPE:
        out.append(("type", value))  # only a heap type's instance can change class
    if isinstance(value, dict):
        if reached_by != "__dict__":  # an instance dict is its object's entry
            out.append(("dict", value))
    elif any(step[0] == "__dict__" for step, _ in plan.children):
        out.append(("obj_dict", value))
    if "LENGTH_CHECK" in leaves:
        if isinstance(value, _CONTAINER_MODULES):
            out.append(("obj_dict", value))
            out.append(("dict", value._modules))
        elif not isinstance(value, (tuple, str, dict)):
            raise _Unsafe(f"LENGTH_CHECK on a {type(value).__name__}")
    if isinstance(value, (tuple, frozenset)) and not _is_immutable(value):
        raise _Unsafe("a tuple holding mutable values")
    for step, child in plan.children:
        _record(child, _step(value, step), out, step[0])


class DictTagSubtree:
    """One tag-safe root: its own guard manager and the DictTagGuard that stands
    for it in the tree."""

    def __init__(self, source: str) -> None:
        from torch._dynamo._dict_tag_guards_C import DictTagGuard

        self.source = source
        self.manager = RootGuardManager()
        self.guard = DictTagGuard(
            self._slow_path,
            torch._dynamo.config.max_saved_pointers_for_recursive_dict_tags_check,
        )
        self.code_part = GUARD_PART.format(source=source)
        self.records = 0
        self.recording = True
        self._plan: Optional[_Plan] = None

    def _slow_path(self, value: object) -> bool:
        if not self.manager.check(value):
            return False
        if self.recording:
            self._try_record(value)
        return True

    def _try_record(self, value: object) -> None:
        if self.records >= MAX_RECORDS + self.guard.recorded:
            self._stop(f"its dicts changed {self.records} times")
            return
        if self._plan is None:
            self._plan = _plan(self.manager)
        entries: list[tuple[str, object]] = []
        try:
            _record(self._plan, value, entries, "root")
            recorded = self.guard.record(value, entries)
        except (_Unsafe, TypeError) as e:
            self._stop(str(e))
            return
        self.records += recorded

    def _stop(self, why: str) -> None:
        log.debug("dict tags of %s: no fast path (%s)", self.source, why)
        self.recording = False
        self.guard.forget()

    def failure(self, value: object) -> Any:
        """The subtree's own GuardDebugInfo for ``value``."""
        return self.manager.check_verbose(value)


class DictTagSubtrees:
    """The tag-safe roots of one guard tree, for GuardBuilder to redirect to."""

    def __init__(self, sources: list[str]) -> None:
        self.by_source = {source: DictTagSubtree(source) for source in sources}
        self.by_code_part = {s.code_part: s for s in self.by_source.values()}
        self._sources: dict[str, object] = {}  # name -> the Source object

    def manager_for(self, source: Any) -> Optional[RootGuardManager]:
        """The manager a guard on ``source`` (a Source) is built under when it is
        a root; None otherwise."""
        name = source.name()
        subtree = self.by_source.get(name)
        if subtree is None:
            return None
        self._sources.setdefault(name, source)
        return subtree.manager

    def install(self, manager_of: Callable[[Any], GuardManager]) -> None:
        """Put each subtree's guard on its node of the tree (``manager_of`` builds
        the node there from the root's Source)."""
        for name, subtree in self.by_source.items():
            source = self._sources.get(name)
            if source is None:
                raise AssertionError(
                    f"no guard was built under the dict-tag root {name}"
                )
            manager_of(source).add_lambda_guard(subtree.guard, [subtree.code_part])


def subtree_failure(
    guard_manager: Any, debug_info: Any, scope: dict[str, object]
) -> Any:
    """Where a DictTagGuard failed, the GuardDebugInfo of its subtree's own guards
    (whose code parts name the guard that failed), else ``debug_info``."""
    subtrees: Optional[DictTagSubtrees] = getattr(
        guard_manager, "dict_tag_subtrees", None
    )
    parts = debug_info.verbose_code_parts
    if subtrees is None or len(parts) != 1 or parts[0] not in subtrees.by_code_part:
        return debug_info
    subtree = subtrees.by_code_part[parts[0]]
    value = eval(subtree.source, dict(guard_manager.global_scope), scope)
    return subtree.failure(value)
