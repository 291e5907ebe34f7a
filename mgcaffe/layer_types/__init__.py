"""Layer types: the implementations behind each Caffe type string, one module per family.

Every module in this package is imported here so that the registry is complete.
"""

import importlib
import pkgutil

from .base import TEST, TRAIN, Layer, LayerContext
from .registry import create_layer, layer_class, layer_types, register_layer

for _info in pkgutil.iter_modules(__path__):
    if _info.name not in ("base", "registry"):
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = [
    "Layer", "LayerContext", "TRAIN", "TEST",
    "create_layer", "layer_class", "layer_types", "register_layer",
]
