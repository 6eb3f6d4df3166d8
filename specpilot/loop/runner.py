"""`LoopRunner`: the runner factory of the loop's workers, isolated and shared alike.

It builds the engine's `SessionRunner` (the systems of one deployment behind the controller's
worker contract) with two settings of the loop's own:

* On CPU it runs torch single-threaded. The models the loop times on CPU (the fixture, test
  checkpoints) are bound by per-operator overhead, not arithmetic, so a second intra-op thread
  buys nothing — and on a machine whose cores are shared (CI, a dev box running other jobs) two
  threads per worker make a short request several times slower and its time noisier. Timing noise
  is what the promotion threshold pays for, so the loop keeps it down.
* On GPU a system's first warm-up also builds every decoding workspace a timed request can need
  (`SessionRunner(workspaces=True)`; `specpilot.engine.runner` says why).

Imported inside worker processes (a patch candidate's worktree first on sys.path), so it imports
the engine's runner from wherever the worker's `specpilot` comes from.

Owns: the thread setting and the choice to warm workspaces. Does not own building systems,
generating or the warm-up itself (`specpilot.engine.runner`).
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
    """`SessionRunner(spec)`, single-threaded on CPU; on GPU each system's first warm-up also builds
    the workspaces its timed requests will use."""
    import torch

    from specpilot.engine.runner import SessionRunner

    cpu = _on_cpu(spec)
    if cpu:
        torch.set_num_threads(CPU_THREADS)
    return SessionRunner(spec, workspaces=not cpu)
