"""The registry of simulated NVML C functions, filled by the modules that implement them.

The implementing modules register their functions with the decorators below when
they are imported; exporter/sim/library.py imports them all.

Three kinds of call, by what the library checks before running one:
- system: the library is initialized and the driver is loaded;
- device: as system, and the first argument is a live device handle (the
  implementation gets the device object); MIG handles get NOT_SUPPORTED unless
  the function is marked mig=True;
- raw: no checks (init, shutdown, event waits do their own).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

Impl = Callable[..., int]  # returns an nvmlReturn code
RawImpl = Callable[..., int | bytes]  # nvmlErrorString returns the message (a char*)
ImplT = TypeVar("ImplT", Impl, RawImpl)


@dataclass(frozen=True)
class Call:
    name: str
    impl: Callable[..., Any]  # Impl, or RawImpl for kind "raw"
    kind: str  # "system" | "device" | "raw"
    mig: bool = False


FUNCTIONS: dict[str, Call] = {}


def _register(kind: str, names: tuple[str, ...], mig: bool = False) -> Callable[[ImplT], ImplT]:
    def deco(impl: ImplT) -> ImplT:
        for name in names:
            if name in FUNCTIONS:
                raise RuntimeError(f"{name} is implemented twice")
            FUNCTIONS[name] = Call(name, impl, kind, mig)
        return impl

    return deco


def system(*names: str) -> Callable[[Impl], Impl]:
    """impl(driver, now, *c_args) -> nvmlReturn."""
    return _register("system", names)


def device(*names: str, mig: bool = False) -> Callable[[Impl], Impl]:
    """impl(driver, dev, now, *c_args_after_the_handle) -> nvmlReturn."""
    return _register("device", names, mig)


def raw(*names: str) -> Callable[[RawImpl], RawImpl]:
    """impl(driver, *c_args) -> nvmlReturn."""
    return _register("raw", names)


def value(x: Any) -> Any:
    """A plain value from an int or a ctypes scalar (c_uint(3) -> 3)."""
    return x if type(x) is int else x.value


def out(x: Any) -> Any:
    """The object behind an output argument: byref(obj) -> obj, pointer -> its contents."""
    obj = getattr(x, "_obj", None)
    if obj is not None:
        return obj
    return x.contents if hasattr(x, "contents") else x
