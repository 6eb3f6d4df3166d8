"""`ControllerConfig.powered`: more blocks at every look, with the same looks and alpha per look."""

import pytest

from specpilot.control.config import ControllerConfig, Placement
from specpilot.errors import ConfigError

SCALED = ("blocks", "extra_blocks", "extra_step")


@pytest.mark.parametrize("base", [ControllerConfig(), ControllerConfig(blocks=10, extra_blocks=10, extra_step=10),
                                  ControllerConfig(blocks=12, extra_blocks=25, extra_step=10),
                                  ControllerConfig(extra_blocks=0)])
@pytest.mark.parametrize("factor", [1, 2, 4])
def test_powered_scales_the_blocks_of_every_look_and_keeps_the_looks(base, factor):
    powered = base.powered(factor)
    assert [getattr(powered, k) for k in SCALED] == [factor * getattr(base, k) for k in SCALED]
    assert powered.looks == base.looks and powered.alpha / powered.looks == base.alpha / base.looks
    looks = range(1, base.looks + 1)
    assert [powered.blocks_at_look(k) for k in looks] == [factor * base.blocks_at_look(k) for k in looks]
    assert powered.max_blocks == factor * base.max_blocks
    # everything else is the same procedure: the same noise floor applies
    rest = {k: v for k, v in powered.to_dict().items() if k not in SCALED}
    assert rest == {k: v for k, v in base.to_dict().items() if k not in SCALED}
    assert powered.procedure_key(Placement.ALTERNATE) == base.procedure_key(Placement.ALTERNATE)


def test_powered_refuses_a_factor_below_one():
    with pytest.raises(ConfigError, match="factor"):
        ControllerConfig().powered(0)
