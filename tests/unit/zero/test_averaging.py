"""Where stage 0 (and every stage after it) divides a gradient sum by the world size."""

from __future__ import annotations

import pytest
import torch

from zerotrain.zero.averaging import Averaging, plan_averaging


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("prescale,predivide", [(False, 1.0), (True, 1.0), (False, 4.0)])
def test_wide_types_divide_inside_the_loss(dtype, prescale, predivide):
    assert plan_averaging(4, prescale, predivide, dtype) == Averaging(in_loss=0.25)


@pytest.mark.parametrize("prescale,predivide,want", [
    (False, 1.0, Averaging(after=0.25)),  # postscale, the spec's default
    (True, 1.0, Averaging(before=0.25)),
    (False, 2.0, Averaging(before=0.5, after=0.5)),
])
def test_fp16_divides_where_the_spec_says(prescale, predivide, want):
    assert plan_averaging(4, prescale, predivide, torch.float16) == want

