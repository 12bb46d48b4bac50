"""The op registry: each op has one signature and several implementations, chosen by priority and conditions.

`register_op(name=, backend=, fn=, priority=, conditions=)` adds one implementation (conditions:
see `conditions.py`). `fn` is a callable or a "module:attribute" string imported on first selection,
so this module and the built-in table (`catalog.py`) load without torch and the launcher checks
--op-backend names here. `registry.op(name)` is the callable layers use: a call's key is (device,
dtype, shape class), where the shape class is the tuple of the op's predicate results on the call
(empty when no implementation has a predicate). The first call with a key tries implementations
by descending priority and caches the first whose conditions all hold; later calls run only the
predicates and a dict lookup. An override (--op-backend / RAPID_LLM_OP_BACKEND) pins an op to one
backend, whose conditions must still hold.
Usage: `ops.rms_norm(x, weight, eps)`; `REGISTRY.set_overrides({"rms_norm": "torch_ref"})`;
`REGISTRY.implementation("rms_norm", "torch_fused", device, dtype)` (one backend, for benchmarks and tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from rapid_llm.config.dtypes import dtype_name
from rapid_llm.ops.conditions import Conditions
from rapid_llm.utils.lazy_import import is_target
from rapid_llm.utils.registry import Registry

OP_BACKEND_ENV = "RAPID_LLM_OP_BACKEND"


@dataclass(frozen=True)
class Implementation:
    op: str
    backend: str
    fn: Callable[..., Any] | str
    priority: int
    conditions: Conditions


@dataclass(frozen=True)
class Selection:
    """The implementation dispatch picked for one key, and why (logged and shown in /server_info)."""

    op: str
    backend: str
    fn: Callable[..., Any]
    reason: str


class NoImplementationError(RuntimeError):
    """No implementation of an op holds for a call; the message gives each one's skip reason."""

    def __init__(self, op: str, device_type: str, dtype: str, skipped: list[tuple[Implementation, str]],
                 forced: str | None, pinned_by: str = "the op-backend override") -> None:
        reasons = "; ".join(f"{impl.backend} (priority {impl.priority}): {why}" for impl, why in skipped)
        pinned = f" ({pinned_by} pins it to {forced!r})" if forced else ""
        super().__init__(f"no implementation of op {op!r} for device {device_type}, dtype {dtype}{pinned}: "
                         f"{reasons or 'none registered'}")


def _cuda_capability(device: Any) -> tuple[int, int]:
    import torch

    return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]


def _device_type(device: Any) -> str:
    return getattr(device, "type", None) or str(device).split(":")[0]


class Op:
    """One op's dispatcher: the hot path is the predicates (if any), a dict lookup and the call."""

    __slots__ = ("name", "_registry", "_cache", "_predicates")

    def __init__(self, name: str, registry: OpRegistry) -> None:
        self.name = name
        self._registry = registry
        self.reset()

    def reset(self) -> None:
        """Forget cached choices (implementations or overrides changed)."""
        self._cache: dict[tuple[Any, ...], Callable[..., Any]] = {}
        self._predicates = self._registry.predicates(self.name)

    def __call__(self, *args: Any) -> Any:
        first = args[0]
        if self._predicates:
            key = (first.device, first.dtype, tuple(predicate(*args) for _, predicate in self._predicates))
        else:
            key = (first.device, first.dtype)
        fn = self._cache.get(key)
        if fn is None:
            fn = self._select(key)
        return fn(*args)

    def _select(self, key: tuple[Any, ...]) -> Callable[..., Any]:
        shape = dict(zip((backend for backend, _ in self._predicates), key[2])) if self._predicates else {}
        fn = self._registry.select(self.name, key[0], key[1], shape).fn
        self._cache[key] = fn
        return fn


class OpRegistry:
    """Implementations per op, overrides, and the dispatchers handed to layers."""

    def __init__(self, capability: Callable[[Any], tuple[int, int]] = _cuda_capability) -> None:
        self._implementations: dict[str, list[Implementation]] = {}
        self._ops: dict[str, Op] = {}
        self._overrides: dict[str, str] = {}
        # "op=backend" -> its function (a "module:attribute" target until first selected).
        self._functions: Registry[Callable[..., Any]] = Registry("op backend")
        self._capability = capability

    def register(self, *, name: str, backend: str, fn: Callable[..., Any] | str, priority: int = 0,
                 conditions: dict[str, Any] | Conditions | None = None) -> Implementation:
        if not callable(fn) and not is_target(fn):
            raise ValueError(f"op {name!r} backend {backend!r}: fn must be a callable or 'module:attribute'")
        parsed = conditions if isinstance(conditions, Conditions) else Conditions.parse(conditions)
        self._functions.register(f"{name}={backend}", fn)
        implementation = Implementation(name, backend, fn, priority, parsed)
        implementations = self._implementations.setdefault(name, [])
        implementations.append(implementation)
        implementations.sort(key=lambda impl: -impl.priority)  # stable: equal priorities keep registration order
        if name in self._ops:
            self._ops[name].reset()
        return implementation

    def op(self, name: str) -> Op:
        if name not in self._ops:
            self._ops[name] = Op(name, self)
        return self._ops[name]

    def implementations(self, name: str) -> tuple[Implementation, ...]:
        """An op's implementations in priority order (e.g. to re-register them in a registry with a fake GPU)."""
        return tuple(self._implementations.get(name, ()))

    def backends(self) -> dict[str, list[str]]:
        """Op name -> its backends in priority order."""
        return {name: [impl.backend for impl in impls] for name, impls in sorted(self._implementations.items())}

    def predicates(self, name: str) -> tuple[tuple[str, Callable[..., bool]], ...]:
        return tuple((impl.backend, impl.conditions.predicate) for impl in self._implementations.get(name, ())
                     if impl.conditions.predicate is not None)

    def check_overrides(self, overrides: dict[str, str], source: str = "--op-backend") -> None:
        """Raise ValueError (one line, naming `source`) for an unknown op or backend."""
        known = self.backends()
        for name, backend in overrides.items():
            if name not in known:
                raise ValueError(f"{source}: unknown op {name!r}; ops: {', '.join(known)}")
            if backend not in known[name]:
                raise ValueError(f"{source}: op {name!r} has no backend {backend!r}; "
                                 f"its backends: {', '.join(known[name])}")

    @property
    def overrides(self) -> dict[str, str]:
        """The pinned backends per op (--op-backend)."""
        return dict(self._overrides)

    def set_overrides(self, overrides: dict[str, str]) -> None:
        self.check_overrides(overrides)
        self._overrides = dict(overrides)
        for op in self._ops.values():
            op.reset()

    def select(self, name: str, device: Any, dtype: Any, shape: dict[str, bool] | None = None) -> Selection:
        """The implementation for `device` and `dtype`; `shape` holds each predicate's result on the call
        (None when there is no call, as at start-up: predicate implementations are then skipped)."""
        return self._first_holding(name, device, dtype, shape, self._overrides.get(name), "the op-backend override")

    def implementation(self, name: str, backend: str, device: Any, dtype: Any,
                       shape: dict[str, bool] | None = None) -> Selection:
        """`backend` of op `name` if its conditions hold (else NoImplementationError with the reason),
        whatever the overrides say: benchmarks and tests run every implementation this way."""
        self.check_overrides({name: backend}, source="implementation")
        return self._first_holding(name, device, dtype, shape, backend, "the caller")

    def call_shape(self, name: str, *args: Any) -> dict[str, bool]:
        """Each predicate implementation's verdict on one call's arguments: the `shape` of `select`."""
        return {backend: bool(predicate(*args)) for backend, predicate in self.predicates(name)}

    def _first_holding(self, name: str, device: Any, dtype: Any, shape: dict[str, bool] | None,
                       forced: str | None, pinned_by: str) -> Selection:
        if name not in self._implementations:
            raise ValueError(f"unknown op {name!r}; ops: {', '.join(self.backends())}")
        device_type, dtype = _device_type(device), dtype_name(dtype)
        skipped: list[tuple[Implementation, str]] = []
        for impl in self._implementations[name]:
            if forced is not None and impl.backend != forced:
                continue
            reason = impl.conditions.static_skip_reason(device_type, dtype, lambda: self._capability(device))
            if reason is None and impl.conditions.predicate is not None:
                if shape is None:
                    reason = "its predicate looks at the call's shapes, so it is chosen per call"
                elif not shape[impl.backend]:
                    reason = "its predicate is false for this call"
            if reason is None:
                why = f"pinned by {pinned_by}" if forced else "highest priority whose conditions hold"
                why += "".join(f"; skipped {skip.backend}: {text}" for skip, text in skipped)
                return Selection(name, impl.backend, self._load(impl), why)
            skipped.append((impl, reason))
        raise NoImplementationError(name, device_type, dtype, skipped, forced, pinned_by)

    def describe(self, device: Any, dtype: Any) -> dict[str, dict[str, str]]:
        """Per op, the backend a call without shape predicates gets on `device`/`dtype`, and why."""
        described = {}
        for name in self.backends():
            try:
                selection = self.select(name, device, dtype)
                described[name] = {"backend": selection.backend, "reason": selection.reason}
            except NoImplementationError as error:
                described[name] = {"backend": "none", "reason": str(error)}
        return described

    def _load(self, impl: Implementation) -> Callable[..., Any]:
        return self._functions.get(f"{impl.op}={impl.backend}")


def parse_op_backends(text: str | None, source: str = "--op-backend") -> dict[str, str]:
    """'attention=torch_ref,rms_norm=torch_ref' -> {op: backend}; a malformed entry raises ValueError."""
    overrides: dict[str, str] = {}
    for entry in (text or "").split(","):
        if not entry.strip():
            continue
        name, sep, backend = (part.strip() for part in entry.partition("="))
        if not sep or not name or not backend:
            raise ValueError(f"{source}: {entry.strip()!r} is not OP=BACKEND (e.g. attention=torch_ref)")
        overrides[name] = backend
    return overrides


REGISTRY = OpRegistry()
register_op = REGISTRY.register
