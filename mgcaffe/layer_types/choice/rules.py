"""Every layer type's rules in one frozen value: what a Net passes to its layers.

`LayerRules()` holds the measured defaults. `LayerRules.from_environment()` is what the
`mgcaffe` commands pass: the defaults, with MGCAFFE_POOLING_LOOPS=0 and MGCAFFE_LRN_LOOPS=0
turning the compiled pooling and LRN loops off (for short-lived processes, where importing
numba costs more than the loops save). To change one threshold:
`dataclasses.replace(rules, convolution=replace(rules.convolution, winograd=False))`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from .convolution import ConvolutionRules
from .inner_product import InnerProductRules
from .normalization import BatchNormRules, LRNRules, ScaleRules
from .pooling import PoolingRules
from .softmax_loss import SoftmaxLossRules

#: Environment switches the commands read: variable -> the rule it turns off ("0").
ENVIRONMENT_SWITCHES = {
    "MGCAFFE_POOLING_LOOPS": ("pooling", "compiled"),
    "MGCAFFE_LRN_LOOPS": ("lrn", "compiled"),
}


@dataclass(frozen=True)
class LayerRules:
    """The rules of each layer type with several paths."""

    convolution: ConvolutionRules = field(default_factory=ConvolutionRules)
    pooling: PoolingRules = field(default_factory=PoolingRules)
    lrn: LRNRules = field(default_factory=LRNRules)
    batch_norm: BatchNormRules = field(default_factory=BatchNormRules)
    scale: ScaleRules = field(default_factory=ScaleRules)
    inner_product: InnerProductRules = field(default_factory=InnerProductRules)
    softmax_loss: SoftmaxLossRules = field(default_factory=SoftmaxLossRules)

    @classmethod
    def from_environment(cls, environ=None) -> LayerRules:
        """The defaults, with the switches of ENVIRONMENT_SWITCHES set to "0" off."""
        env = os.environ if environ is None else environ
        rules = cls()
        for variable, (layer, name) in ENVIRONMENT_SWITCHES.items():
            if env.get(variable, "1") == "0":
                rules = replace(rules, **{layer: replace(getattr(rules, layer), **{name: False})})
        return rules
