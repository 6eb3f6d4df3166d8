"""Where the controller's prompts come from: an injectable `PromptSource`.

    PromptSource = Callable[[int, int], list[list[int]]]    # (count, seed) -> token-id prompts

The same (count, seed) must give the same prompts. The controller draws each block's prompts
with a seed derived from (config seed, stream, block index): candidates screened in one round see
the same prompts block for block (common random numbers), a round's winner is re-measured on a
fresh stream, and warm-up and gate prompts come from streams of their own, so a worker never
meets a timed prompt before it is timed. The gate's stream is indexed by a key fresh for every
evaluation (`Controller._draw_key`), so no fixed set of gate prompts exists to be lossless on.

For the CLI the source is built from the deployment's benchmark prompt sets by a factory named
"module:attr" (default `specpilot.bench.prompts:controller_prompt_source`, called with the
`Deployment`); tests inject their own.

Owns: drawing and checking prompts. Does not own the benchmark sets or their formatting.
"""

from __future__ import annotations

from typing import Callable

from specpilot.control.blocks import derived_seed
from specpilot.control.arm import load_object
from specpilot.errors import ConfigError

PromptSource = Callable[[int, int], list[list[int]]]

DEFAULT_PROMPT_SOURCE = "specpilot.bench.prompts:controller_prompt_source"


def draw(source: PromptSource, count: int, seed: int, stream: str, index: int | str) -> list[list[int]]:
    """`count` prompts for (stream, index) (index: a block number, or a key); ConfigError if the
    source returns something else."""
    prompts = source(count, derived_seed(seed, "prompts", stream, index))
    if not isinstance(prompts, list) or len(prompts) != count:
        raise ConfigError(f"prompt source returned {len(prompts) if isinstance(prompts, list) else prompts!r} "
                          f"prompts, expected {count}")
    for p in prompts:
        if not isinstance(p, (list, tuple)) or not p or not all(type(t) is int and t >= 0 for t in p):
            raise ConfigError("prompt source must return non-empty lists of non-negative token ids")
    return [list(p) for p in prompts]


def load_prompt_source(deployment, path: str = DEFAULT_PROMPT_SOURCE) -> PromptSource:
    """Build the source for `deployment` from the factory named `path`."""
    try:
        factory = load_object(path, "prompt source")
    except ConfigError as err:
        raise ConfigError(f"{err}; the benchmark prompt sets are needed "
                          "(or pass --prompt-source module:attr)") from None
    return factory(deployment)
