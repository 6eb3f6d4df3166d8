"""Loop settings: device defaults, timing presets, controller overrides, validation, the CLI's flags."""

import argparse

import pytest
from loop_fixtures import DEPLOYMENT

from specpilot.errors import ConfigError
from specpilot.cli import run as cli
from specpilot.loop.config import LoopConfig, Timing, controller_config, for_device


def test_device_defaults_and_presets():
    cpu, gpu = for_device("cpu"), for_device("cuda", rounds=5)
    assert (cpu.timing, cpu.budget_minutes, gpu.timing, gpu.rounds, gpu.budget_minutes) == (
        Timing.QUICK, None, Timing.SCALED, 5, None)  # CPU: sized by its 2 rounds, said up front
    quick = controller_config(cpu, DEPLOYMENT)
    assert (quick.blocks, quick.requests_per_block, quick.max_new_tokens, quick.looks) == (12, 3, 32, 2)
    scaled = controller_config(gpu, DEPLOYMENT)
    assert (scaled.blocks, scaled.max_new_tokens, scaled.looks) == (10, 128, 3)
    standard = controller_config(for_device("cuda", timing=Timing.STANDARD), DEPLOYMENT)
    assert standard.max_new_tokens == DEPLOYMENT.max_new_tokens and standard.blocks == 20
    tuned = controller_config(for_device("cpu", controller={"blocks": 9}, seed=3), DEPLOYMENT)
    assert (tuned.blocks, tuned.seed) == (9, 3)
    with pytest.raises(ConfigError, match="unknown field"):
        controller_config(for_device("cpu", controller={"blockz": 9}), DEPLOYMENT)
    with pytest.raises(ConfigError, match="final_prompts must be >= 5"):
        LoopConfig(final_prompts=4)
    with pytest.raises(ConfigError, match="final_heldout_prompts must be >= 0"):
        LoopConfig(final_heldout_prompts=-1)
    assert LoopConfig().final_heldout_prompts == 8 and LoopConfig(final_heldout_prompts=0).final_heldout_prompts == 0
    with pytest.raises(ConfigError, match="--coding-agents must be >= 1"):
        LoopConfig(coding_agents=0)


def test_flags_map_onto_the_config():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    cli.register(sub)
    args = parser.parse_args(["run", "--rounds", "4", "--agents", "knob,integration", "--budget-minutes", "9",
                              "--controller", "blocks=8", "--controller", "order=random", "--no-final",
                              "--coding-agents", "3", "--final-heldout-prompts", "0"])
    config = cli.config_from_args(args, "cuda")
    assert (config.rounds, config.agents, config.budget_minutes, config.final) == (4, ("knob", "integration"), 9.0,
                                                                                  False)
    assert config.controller == {"blocks": 8, "order": "random"} and config.timing is Timing.SCALED
    assert config.coding_agents == 3 and cli.config_from_args(parser.parse_args(["run"]), "cpu").coding_agents == 2
    assert config.final_heldout_prompts == 0
    assert cli.config_from_args(parser.parse_args(["run"]), "cpu").final_heldout_prompts == 8
    assert args.func is cli.run_command
    with pytest.raises(ConfigError, match="FIELD=VALUE"):
        cli.controller_fields(["blocks"])


def test_a_continuous_regime_times_two_prompts_per_slot():
    """Each timed request of a continuous deployment is served closed-loop with two prompts per slot
    (admissions while rows decode, as the final measurement's units); a static batch's is one batch."""
    from dataclasses import replace

    from specpilot.config import Regime, load_deployment
    from specpilot.loop.final import FINAL_REQUESTS_PER_SLOT

    served = load_deployment("fixture-x16-batch")
    assert served.regime.continuous
    gpu = for_device("cuda")
    assert controller_config(gpu, served).request_size == 2 * served.regime.batch == FINAL_REQUESTS_PER_SLOT * 8
    static = replace(served, regime=Regime(batch=8))
    assert controller_config(gpu, static).request_size == 8
    assert controller_config(gpu, DEPLOYMENT).request_size == DEPLOYMENT.regime.batch


def test_a_continuous_regime_times_fewer_longer_requests_per_block():
    """Scaled timing under continuous batching: one request of 256 new tokens per block instead of two
    of 128 (acceptance grows along an output); a static batch keeps two of 128, an explicit field wins."""
    from dataclasses import replace

    from specpilot.config import Regime, load_deployment

    served, gpu = load_deployment("fixture-x16-batch"), for_device("cuda")
    c = controller_config(gpu, served)
    assert (c.requests_per_block, c.max_new_tokens, c.blocks) == (1, 256, 10)
    static = controller_config(gpu, replace(served, regime=Regime(batch=8)))
    assert (static.requests_per_block, static.max_new_tokens) == (2, 128)
    short = controller_config(gpu, replace(served, max_new_tokens=200))
    assert short.max_new_tokens == 200  # capped by the deployment's
    assert controller_config(for_device("cuda", controller={"max_new_tokens": 64}), served).max_new_tokens == 64
    assert controller_config(for_device("cpu"), served).max_new_tokens == 32  # quick timing has no such rule


def test_a_budget_without_a_round_count_sizes_the_run():
    """--budget-minutes alone: the budget (or convergence) ends the run, not the device's default count."""
    from specpilot.loop.budget_plan import plan_line
    from specpilot.loop.config import BUDGET_ROUNDS, rounds_text

    assert for_device("cuda", budget_minutes=9).rounds == BUDGET_ROUNDS
    assert for_device("cuda", budget_minutes=9, rounds=3).rounds == 3
    assert for_device("cuda").rounds == 3 and for_device("cpu").rounds == 2
    assert rounds_text(BUDGET_ROUNDS) == f"as many rounds as the budget fits (at most {BUDGET_ROUNDS})"
    assert plan_line(429, BUDGET_ROUNDS, 130, 129, 3, 3) == (
        "budget: 429 s left: about 2 round(s) (~130 s each) and the final measurement (~129 s) fit; the budget "
        "sizes the run (shorter rounds leave room for more)")
    assert plan_line(429, 3, 130, 129, 3, 3).startswith("budget: 429 s left: 2 of the 3 round(s)")
