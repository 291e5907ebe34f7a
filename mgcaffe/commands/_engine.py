"""What the commands that build nets (train, test, time, extract_features) pass to every Net.

The layers' path rules come from the environment here, in one place: the measured defaults,
with MGCAFFE_POOLING_LOOPS=0 and MGCAFFE_LRN_LOOPS=0 turning the compiled pooling and LRN
loops off (a short-lived process saves less than importing numba costs). Library code that
builds a Net itself gets the defaults unless it passes rules of its own.
"""

from __future__ import annotations

import os

from ..layer_types.choice.rules import LayerRules


def layer_rules(environ=None) -> LayerRules:
    """The rules of this command's nets: the defaults with the environment's switches."""
    return LayerRules.from_environment(os.environ if environ is None else environ)
