"""The leak census: the tensors with autograd history a program still holds after a
step, charged to the attribute, variable or container that holds them (MemoryMonitor.step)."""

from __future__ import annotations

import collections
import gc
import itertools
import os
import sys
import time
import types
import weakref

import torch

from ._shared import _bytes, _storage


class MemoryLeakWarning(UserWarning):
    """A container or attribute that keeps tensors with autograd history, and so their
    graphs, from step to step (:meth:`MemoryMonitor.step`). Warned once per source."""


class Leak:
    """One source of a leak: the attribute, variable or container (``source``, e.g.
    ``Net.reconstruction_targets``) that holds ``tensors`` tensors with autograd history
    (``kind``: ``list``, ``dict``, ``tensor``...), ``bytes`` in them and in the saved
    tensors of their graphs, growing by ``bytes_per_step`` (and ``nodes_per_step`` graph
    nodes); ``remedy`` says what to change."""

    __slots__ = ("source", "kind", "tensors", "bytes", "bytes_per_step", "graph_nodes", "step", "remedy",
                 "nodes_per_step")

    def __init__(self, source, kind, tensors, nbytes, bytes_per_step, graph_nodes, step, remedy,
                 nodes_per_step=0.0) -> None:
        self.source = source
        self.kind = kind
        self.tensors = tensors
        self.bytes = nbytes
        self.bytes_per_step = bytes_per_step
        self.graph_nodes = graph_nodes
        self.step = step
        self.remedy = remedy
        self.nodes_per_step = nodes_per_step

    def __str__(self) -> str:
        tensors = f"{self.tensors} tensor" + ("" if self.tensors == 1 else "s")
        growth = f"+{_bytes(self.bytes_per_step)}/step"
        if self.nodes_per_step >= 1 and self.bytes_per_step < 1024:
            # A graph that grows as a chain (a running value updated without .detach()).
            growth += f", +{self.nodes_per_step:.0f} graph nodes/step"
        return (f"{self.source} ({self.kind}, {tensors}, {growth}) keeps tensors with autograd history, and "
                f"their graphs, from step to step: {self.remedy}")

    def __repr__(self) -> str:
        return (f"Leak(source={self.source!r}, kind={self.kind!r}, tensors={self.tensors}, bytes={self.bytes}, "
                f"bytes_per_step={self.bytes_per_step:.0f})")


# What nn.Module keeps of its own in __dict__ (hooks, the parameter table): never a user's
# store. `_buffers` and `_modules` are walked (a buffer with a grad_fn is a leak too).
_MODULE_INTERNALS = frozenset(torch.nn.Module().__dict__) - {"_buffers", "_modules"}
_LIBRARY_ROOTS = tuple({os.path.dirname(os.__file__)} | {p for p in sys.path if p.endswith(("site-packages", "dist-packages"))})
# This package's own files: its frames and objects are never the user's.
_PACKAGE_DIR = os.path.dirname(__file__) + os.sep
_SCALARS = (str, bytes, int, float, complex, bool, type(None), range, type, types.ModuleType, types.FunctionType,
            types.BuiltinFunctionType, types.MethodType, types.CodeType, types.FrameType, property, staticmethod,
            classmethod)
_user_types: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _library_file(path) -> bool:
    return bool(path) and (path.startswith(_LIBRARY_ROOTS) or path.startswith(_PACKAGE_DIR) or "<frozen" in path)


def _users_class(cls) -> bool:
    """A class of the user's program (its module's file outside the standard library and
    site-packages): its instances' attributes are walked; a library's objects are not."""
    known = _user_types.get(cls)
    if known is None:
        module = sys.modules.get(getattr(cls, "__module__", None) or "")
        known = module is not None and not _library_file(getattr(module, "__file__", None) or "<frozen>")
        _user_types[cls] = known
    return known


# The `_saved_*` attributes of each kind of graph node (read once per kind; the kinds are
# torch's generated classes, a fixed set).
_saved_names: dict = {}


class _Reading:
    """One source's share of a census."""

    __slots__ = ("kind", "tensors", "bytes", "nodes", "scalars", "bounded")

    def __init__(self, kind: str, bounded: bool) -> None:
        self.kind = kind
        self.tensors = 0
        self.bytes = 0
        self.nodes = 0
        self.scalars = True
        self.bounded = bounded


class _Census:
    """The tensors with autograd history that the program holds after a step, by source.

    Walked from the roots a training loop holds its objects by (the locals of the frames
    that called :meth:`MemoryMonitor.step`, and the globals of the user's modules) through
    containers, modules, optimizers and the user's own objects, never into library objects,
    within a visit and a time budget. Each tensor found is charged to the attribute or
    variable of the nearest named object (``Net.targets``, ``losses in train()``,
    ``__main__.history``), with its storage and the storages its graph saved for backward.
    """

    def __init__(self, frame, budget_visits: int, deadline: float, known=frozenset()) -> None:
        self.readings: dict = {}
        # Sources already warned of: their tensors are counted, their graphs not walked
        # again (a leak found costs the census no more as it grows).
        self._known_leaks = known
        self.visits = 0
        self.complete = True
        self._budget = budget_visits
        self._deadline = deadline
        self._seen: set = set()
        self._storages: set = set()
        self._nodes: set = set()
        self._node_refs: list = []  # the nodes walked, alive until the census ends: ids stay unique
        stack = []
        globals_seen = set()
        while frame is not None:
            code = frame.f_code
            if not _library_file(code.co_filename):
                where = f"in {code.co_name}()" if code.co_name != "<module>" else None
                for name, value in list(frame.f_locals.items()) if where else ():
                    stack.append((value, f"{name} {where}", value))
                if id(frame.f_globals) not in globals_seen:
                    globals_seen.add(id(frame.f_globals))
                    module = frame.f_globals.get("__name__", "?")
                    for name, value in list(frame.f_globals.items()):
                        if not name.startswith("__"):
                            stack.append((value, f"{module}.{name}", value))
            frame = frame.f_back
        stack.reverse()  # the innermost frame's locals first: a model is named from there
        self._walk(stack)

    def _walk(self, stack) -> None:
        seen, readings = self._seen, self.readings
        while stack:
            obj, source, holder = stack.pop()
            if isinstance(obj, _SCALARS) or id(obj) in seen:
                continue
            seen.add(id(obj))
            self.visits += 1
            if self.visits % 1024 == 0 and (self.visits > self._budget or time.perf_counter() > self._deadline):
                self.complete = False
                return
            if isinstance(obj, torch.Tensor):
                if obj.grad_fn is not None and not obj.is_meta:
                    reading = readings.get(source)
                    if reading is None:
                        bounded = isinstance(holder, collections.deque) and holder.maxlen is not None
                        kind = "tensor" if holder is obj else type(holder).__name__
                        reading = readings[source] = _Reading(kind, bounded)
                    self._charge(reading, obj, source not in self._known_leaks)
                continue
            if isinstance(obj, torch.nn.Module):
                name = type(obj).__name__
                for key, value in list(vars(obj).items()):
                    if key == "_modules" or key == "_buffers":
                        for sub, child in list(value.items()):
                            if child is not None:
                                stack.append((child, f"{name}.{sub}", child))
                    elif key not in _MODULE_INTERNALS:
                        stack.append((value, f"{name}.{key}", value))
            elif isinstance(obj, torch.optim.Optimizer):
                stack.append((obj.state, f"{type(obj).__name__}.state", obj.state))
            elif isinstance(obj, dict):
                self._items(stack, obj.values(), len(obj), source, holder)
            elif isinstance(obj, (list, tuple, collections.deque, set, frozenset)):
                self._items(stack, obj, len(obj), source, holder)
            elif _users_class(type(obj)):
                attributes = getattr(obj, "__dict__", None)
                if isinstance(attributes, dict):
                    name = type(obj).__name__
                    for key, value in list(attributes.items()):
                        stack.append((value, f"{name}.{key}", value))

    @staticmethod
    def _items(stack, items, length, source, holder) -> None:
        if length > 4096:
            # A large container of plain data (a dataset's index, a vocabulary): walked
            # only if its ends hold something a tensor could hide in.
            probe = list(items)
            ends = probe[:64] + probe[-64:]
            if all(isinstance(v, _SCALARS) for v in ends):
                return
            items = probe
        for value in items:
            if not isinstance(value, _SCALARS):
                stack.append((value, source, holder))

    def _charge(self, reading: _Reading, tensor, graph: bool) -> None:
        reading.tensors += 1
        if tensor.dim() != 0:
            reading.scalars = False
        key, nbytes = _storage(tensor)
        if key not in self._storages:
            self._storages.add(key)
            reading.bytes += nbytes
        if not graph:
            return
        # The graph behind it: its nodes, and what they saved for backward. A node whose
        # saved tensors backward freed ends the walk there: that backward ran through
        # every node below it and freed them too (a graph kept after its backward, as a
        # logged loss's, costs one node per census, not the model's depth).
        nodes = [tensor.grad_fn]
        while nodes:
            node = nodes.pop()
            if node is None or id(node) in self._nodes:
                continue
            self._nodes.add(id(node))
            self._node_refs.append(node)
            self.visits += 1
            if self.visits > self._budget:
                self.complete = False
                return
            if not self._saved_bytes(reading, node):
                continue
            reading.nodes += 1
            nodes.extend(next_node for next_node, _ in node.next_functions)

    def sweep(self) -> None:
        """The tensors with autograd history the walk did not reach (held in a closure, a
        library's object, a hook's state), found among every object the garbage collector
        tracks, and named through their referrers: ``gc.get_referrers`` up to an object's
        attribute, a module's global, a closure's variable, within three levels."""
        self.readings = {}
        objects = gc.get_objects()
        kinds = {t for t in set(map(type, objects)) if issubclass(t, torch.Tensor)}
        found = [t for t in itertools.compress(objects, map(kinds.__contains__, map(type, objects)))
                 if id(t) not in self._seen and t.grad_fn is not None and not t.is_meta]
        del objects
        if not found:
            return
        named = self._names(found)
        for tensor in found:
            source, holder = named.get(id(tensor)) or (f"an unnamed tensor at {id(tensor):#x}", tensor)
            reading = self.readings.get(source)
            if reading is None:
                bounded = isinstance(holder, collections.deque) and holder.maxlen is not None
                kind = "tensor" if holder is tensor else type(holder).__name__
                reading = self.readings[source] = _Reading(kind, bounded)
            self._charge(reading, tensor, source not in self._known_leaks)
            if time.perf_counter() > self._deadline:
                self.complete = False
                return

    def _names(self, found: list) -> dict:
        """id(tensor) -> (source, holder) for the tensors ``found``: up their referrers,
        one ``gc.get_referrers`` for all of them per level (each call walks every object
        the collector tracks), to an instance's attribute, a module's global or a
        closure's variable."""
        modules = {id(m.__dict__): m for m in list(sys.modules.values()) if isinstance(m, types.ModuleType)}
        # A chain per object being traced: [object, the tensors it covers, holder, key].
        chains = {id(t): [t, [t], t, None] for t in found}
        named: dict = {}
        for _ in range(4):
            if not chains or time.perf_counter() > self._deadline:
                break
            objects = [chain[0] for chain in chains.values()]
            referrers = gc.get_referrers(*objects)
            # This function's own lists refer to the objects too: never a holder.
            ours = {id(objects), id(referrers), id(found)} | {id(c) for c in chains.values()} \
                | {id(c[1]) for c in chains.values()} | {id(v) for v in named.values()}
            following: dict = {}
            for referrer in referrers:
                if id(referrer) in ours or isinstance(referrer, types.FrameType):
                    continue
                for child in gc.get_referents(referrer):
                    chain = chains.get(id(child))
                    if chain is None or id(child) in following or any(id(t) in named for t in chain[1][:1]):
                        continue
                    held, key = chain[2], chain[3]
                    if isinstance(referrer, dict):
                        key = next((k for k, v in referrer.items() if v is child), key)
                        module = modules.get(id(referrer))
                        if module is not None:
                            self._resolve(named, chain, f"{module.__name__}.{key}")
                        else:  # an instance's __dict__ or a dict of the user's: one level up
                            following[id(child)] = (referrer, chain[1], held, key)
                    elif isinstance(referrer, types.FunctionType):
                        closure = referrer.__closure__ or ()
                        cell = next((c for c in closure if c is child), None)
                        if cell is None and isinstance(child, tuple) and child is closure:
                            cell = next((c for c in closure if c is chain[3]), None)
                        if cell is not None:
                            name = referrer.__code__.co_freevars[closure.index(cell)]
                            self._resolve(named, chain, f"{name} (closure of {referrer.__qualname__})")
                    elif type(referrer).__name__ == "cell":
                        following[id(child)] = (referrer, chain[1], held, key)
                    elif isinstance(referrer, tuple) and type(child).__name__ == "cell":
                        following[id(child)] = (referrer, chain[1], held, child)  # a function's __closure__
                    elif isinstance(referrer, (list, tuple, set, frozenset, collections.deque)):
                        following[id(child)] = (referrer, chain[1], referrer, None)
                    elif getattr(referrer, "__dict__", None) is child and key is not None:
                        self._resolve(named, chain, f"{type(referrer).__name__}.{key}")
                    elif isinstance(getattr(referrer, "__dict__", None), dict):
                        attribute = next((k for k, v in vars(referrer).items() if v is child), None)
                        if attribute is not None:
                            self._resolve(named, chain, f"{type(referrer).__name__}.{attribute}")
            chains = {}
            for obj, covers, held, key in following.values():
                if not any(id(t) in named for t in covers[:1]):
                    merged = chains.setdefault(id(obj), [obj, [], held, key])
                    merged[1].extend(covers)
            following = referrers = objects = None  # not to be found as holders next level
        return named

    @staticmethod
    def _resolve(named: dict, chain, source: str) -> None:
        for tensor in chain[1]:
            named.setdefault(id(tensor), (source, chain[2]))

    def _saved_bytes(self, reading: _Reading, node) -> bool:
        """Charges what ``node`` saved for backward; False once backward freed it."""
        names = _saved_names.get(type(node))
        if names is None:
            names = _saved_names[type(node)] = tuple(a for a in dir(type(node)) if a.startswith("_saved_"))
        for name in names:
            try:
                value = getattr(node, name)
            except Exception:  # noqa: BLE001 - "saved tensors ... have already been freed"
                return False
            for saved in (value,) if isinstance(value, torch.Tensor) else \
                    value if isinstance(value, (tuple, list)) else ():
                if isinstance(saved, torch.Tensor):
                    key, nbytes = _storage(saved)
                    if key not in self._storages:
                        self._storages.add(key)
                        reading.bytes += nbytes
        return True


def _remedy(source: str, reading) -> str:
    if " (closure of " in source or " in " in source:
        name = source.split(" ")[0]  # "history (closure of f)", "losses in train()"
    else:
        name = source.rsplit(".", 1)[-1]  # "Net.reconstruction_targets", "__main__.losses"
    if reading.scalars:
        if reading.kind == "tensor":
            return (f"keep it as a number with .item() ({name} = value.item()), or store value.detach(); "
                    f"or compute it under torch.no_grad()")
        return (f"log losses as numbers with .item() ({name}.append(loss.item())), or keep loss.detach(); "
                f"or compute them under torch.no_grad()")
    if reading.kind == "tensor":
        return f"store it with .detach() ({name} = x.detach(), .detach().cpu() off the GPU), or compute it under torch.no_grad()"
    return (f"store them with .detach() ({name}.append(x.detach()), .detach().cpu() off the GPU), or compute "
            f"them under torch.no_grad()")
