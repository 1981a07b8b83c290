"""B300 (SM103): a profile from public facts on the B200's schedule, whose compute capability
10.3 carries flash-attn-4's own choice there (no exp2 emulated)."""
import pytest

from fa4sim import Problem, hardware, simulate
from fa4sim.errors import InputError

P = Problem(1, 16, 8192, 8192, 128)


def test_the_b300_profile():
    b200, b300 = hardware.load("b200"), hardware.load("b300")
    assert b300.arch == "sm100" and b300.capability == "10.3" and b200.capability == "10.0"
    assert b300.mufu_ex2_per_clk == 2 * b200.mufu_ex2_per_clk and b300.power_cap_w > b200.power_cap_w
    assert b300.to_json()["compute_capability"] == "10.3"
    assert hardware.from_json(b300.to_json()).capability == "10.3"
    # each value differing from the B200's names its own source
    for k in hardware.PARAMS:
        if b300.values[k] != b200.values[k]:
            assert "as the B200" not in b300.sources[k], k


def test_flash_attn_4_emulates_no_exp2_on_sm103():
    on_b200, on_b300 = simulate("b200", problem=P), simulate("b300", problem=P)
    assert on_b200.knobs["exp_emulation"] > 0 and on_b300.knobs["exp_emulation"] == 0.0
    # the what-if: the B200's emulation split on the B300's MUFU
    what_if = simulate("b300", problem=P, overrides={"exp_emulation": on_b200.knobs["exp_emulation"]})
    assert what_if.knobs["exp_emulation"] == on_b200.knobs["exp_emulation"]
    # twice the exp2 rate takes the MUFU off the tensor core's path: the tensor core binds
    assert on_b300.bottleneck.startswith("tensor core-bound") and on_b300.tflops > on_b200.tflops


@pytest.mark.parametrize("cc", ["10.3", "9.5", 10.3, None])
def test_capability_must_belong_to_the_arch(cc):
    data = hardware.load("h100").to_json()
    data["compute_capability"] = cc
    with pytest.raises(InputError, match="compute_capability") as e:
        hardware.from_json(data, "test")
    assert "\n" not in str(e.value) and "9.0" in str(e.value)
