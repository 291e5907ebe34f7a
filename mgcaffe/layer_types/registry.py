"""Registry from prototxt type string to Layer class."""

from __future__ import annotations

import difflib

from ..errors import LayerError
from .base import Layer, LayerContext

_REGISTRY: dict[str, type[Layer]] = {}


def register_layer(cls: type[Layer]) -> type[Layer]:
    """Class decorator: make `cls` constructible by its `type` string."""
    if not cls.type:
        raise TypeError(f"{cls.__name__} has no `type`")
    if cls.type in _REGISTRY and _REGISTRY[cls.type] is not cls:
        raise TypeError(f"layer type {cls.type!r} registered twice "
                        f"({_REGISTRY[cls.type].__name__} and {cls.__name__})")
    _REGISTRY[cls.type] = cls
    return cls


def layer_types() -> list[str]:
    """Every registered type string, sorted."""
    return sorted(_REGISTRY)


def layer_class(type_name: str) -> type[Layer]:
    """The class registered for `type_name`; the error suggests the closest known type, or
    lists them all when none is close."""
    try:
        return _REGISTRY[type_name]
    except KeyError:
        known = layer_types()
        close = [t for t in known if t.lower() == str(type_name).lower()] or \
            difflib.get_close_matches(str(type_name), known, n=1, cutoff=0.6)
        if close:
            raise LayerError(f"unknown layer type {type_name!r}; did you mean {close[0]!r}? "
                             "(type names are case-sensitive, as in Caffe)") from None
        raise LayerError(f"unknown layer type {type_name!r}; known types: "
                         f"{', '.join(known)}") from None


def create_layer(param, ctx: LayerContext | None = None) -> Layer:
    """Instantiate the layer described by a LayerParameter."""
    try:
        cls = layer_class(param.type)
    except LayerError as exc:
        raise LayerError(f"layer {param.name!r}: {exc}") from None
    return cls(param, ctx)
