"""`LoopRunner`: the runner the loop's controller builds in every worker process.

It is the engine's `SystemRunner` (one system of one deployment behind the controller's worker
contract) with two differences:

* On CPU it runs torch single-threaded. The models the loop times on CPU (the fixture, test
  checkpoints) are bound by per-operator overhead, not arithmetic, so a second intra-op thread
  buys nothing — and on a machine whose cores are shared (CI, a dev box running other jobs) two
  threads per worker made a 32-token request 5-8x slower and its time 5x noisier (measured on the
  2-core dev machine). Timing noise is what the promotion threshold pays for, so the loop keeps it
  down.
* On GPU its warm-up also builds every decoding workspace a timed request can need
  (`warm_workspaces`). The generator keeps one workspace (KV cache, CUDA graphs, warmed prefill
  shapes) per (batch, capacity), the capacity rounded up from prompt + new tokens + the tree's
  slack; the first request whose prompt lands in a new capacity builds one — graph capture and a
  pass over every padded prefill shape — inside its timed span, as the controller times from
  outside. On the H200 (fixture-x16) that costs 1.5-3.5 s inside a 0.3 s request, more for a
  candidate whose deeper tree needs more slack: one such block outweighs a real gain (a +18% tree
  stayed below the threshold), so no timed request may build a workspace.

Imported inside worker processes (a patch candidate's worktree first on sys.path), so it imports
the engine's runner from wherever the worker's `specpilot` comes from.

Owns: the thread setting and the workspace warm-up. Does not own building the system or
generating (`specpilot.engine.runner`).
"""

from __future__ import annotations

LOOP_RUNNER = "specpilot.loop.runner:LoopRunner"
CPU_THREADS = 1


def _on_cpu(spec) -> bool:
    device = getattr(spec, "device", None)
    if device is not None:
        return str(device).startswith("cpu")
    import torch

    return not torch.cuda.is_available()


def LoopRunner(spec):
    """Build `SystemRunner(spec)`, single-threaded when the worker runs on CPU; on GPU its warm-up
    also builds the workspaces timed requests will use (`warm_workspaces`)."""
    import torch

    from specpilot.engine.runner import SystemRunner

    if _on_cpu(spec):
        torch.set_num_threads(CPU_THREADS)
        return SystemRunner(spec)
    return WarmedRunner(SystemRunner(spec))


def SharedLoopRunner(spec):
    """Build `SessionRunner(spec)` for a shared worker (every system of the deployment in one
    process), single-threaded on CPU; each system's first warm-up also builds its workspaces."""
    import torch

    from specpilot.engine.runner import SessionRunner

    cpu = _on_cpu(spec)
    if cpu:
        torch.set_num_threads(CPU_THREADS)
    return WarmedSessionRunner(SessionRunner(spec), workspaces=not cpu)


class WarmedSessionRunner:
    """A `SessionRunner` whose first warm-up of each system also runs `warm_workspaces` for it."""

    def __init__(self, runner, workspaces: bool = True):
        self.runner = runner
        self.workspaces = workspaces  # on CPU there are no graphs to capture: plain warm-up only
        self.warmed: dict[str, list[int]] = {}  # system fingerprint -> prompt lengths warmed

    def warm(self, knobs: dict, prompts: list[list[int]], max_new_tokens: int) -> None:
        self.runner.warm(knobs, prompts, max_new_tokens)
        key = self.runner.system(knobs).fingerprint()
        if self.workspaces and key not in self.warmed:
            self.warmed[key] = warm_workspaces(_OneSystem(self.runner, knobs), prompts, max_new_tokens)

    def run(self, knobs: dict, prompts: list[list[int]], max_new_tokens: int, stop_at_eos: bool = True) -> dict:
        return self.runner.run(knobs, prompts, max_new_tokens, stop_at_eos)


class _OneSystem:
    """One system of a `SessionRunner`, seen as a single-system runner by `warm_workspaces`."""

    def __init__(self, runner, knobs: dict):
        self.generator = runner.generator(knobs)
        self.session = runner.session


class WarmedRunner:
    """A runner whose first warm-up also runs `warm_workspaces`; everything else is the runner's."""

    def __init__(self, runner):
        self.runner = runner
        self.warmed: list[int] | None = None  # prompt lengths of the workspace warm-up, once it ran

    def warmup(self, prompts: list[list[int]], max_new_tokens: int) -> None:
        self.runner.warmup(prompts, max_new_tokens)
        if self.warmed is None:
            self.warmed = warm_workspaces(self.runner, prompts, max_new_tokens)

    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        return self.runner.generate(prompts, max_new_tokens)

    def __getattr__(self, name):
        if name == "runner":
            raise AttributeError(name)
        return getattr(self.runner, name)


def workspace_lengths(generator, max_new_tokens: int) -> list[int]:
    """The shortest prompt length of each of the generator's smallest workspace capacities (as many
    as it keeps at once), for `max_new_tokens` new tokens; [] when the generator does not say."""
    capacity_for = getattr(generator, "capacity_for", None)
    keep = getattr(generator, "max_workspaces", 0)
    limit = getattr(generator, "max_positions", 0)
    if capacity_for is None or keep < 1 or limit < 1:
        return []
    from specpilot.errors import ConfigError

    lengths, last = [], None
    for length in range(1, limit + 1):
        try:
            cap = capacity_for(length, max_new_tokens)
        except ConfigError:  # prompt + new tokens beyond the context: no longer prompt fits either
            break
        if cap != last:
            if len(lengths) == keep:
                break
            lengths.append(length)
            last = cap
    return lengths


def warm_workspaces(runner, prompts: list[list[int]], max_new_tokens: int) -> list[int]:
    """Generate once at the shortest prompt length of each workspace capacity the generator keeps
    (the smallest `max_workspaces` of them, which hold every prompt of the shipped sets), largest
    first so the common small ones are the most recently used; the prompts are the warm-up prompt's
    tokens repeated, never a timed prompt. Returns the lengths run."""
    generator = getattr(runner, "generator", None)
    seed = next((list(p) for p in prompts if p), None)
    if generator is None or seed is None:
        return []
    batch = max(1, len(prompts))
    session = getattr(runner, "session", None)
    if session is not None:
        batch = session.deployment.regime.batch
    lengths = workspace_lengths(generator, max_new_tokens)
    for length in reversed(lengths):
        prompt = (seed * (length // len(seed) + 1))[:length]
        generator.generate([prompt] * batch, max_new_tokens)
    return lengths
