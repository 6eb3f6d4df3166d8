"""`LoopRunner`: the runner the loop's controller builds in every worker process.

It is the engine's `SystemRunner` (one system of one deployment behind the controller's worker
contract) with one difference: on CPU it runs torch single-threaded. The models the loop times on
CPU (the fixture, test checkpoints) are bound by per-operator overhead, not arithmetic, so a second
intra-op thread buys nothing — and on a machine whose cores are shared (CI, a dev box running
other jobs) two threads per worker made a 32-token request 5-8x slower and its time 5x noisier
(measured on the 2-core dev machine). Timing noise is what the promotion threshold pays for, so
the loop keeps it down. On GPU it is exactly `SystemRunner`.

Imported inside worker processes (a patch candidate's worktree first on sys.path), so it imports
the engine's runner from wherever the worker's `specpilot` comes from.

Owns: the thread setting. Does not own building the system or generating (`specpilot.engine.runner`).
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
    """Build `SystemRunner(spec)`, single-threaded when the worker runs on CPU."""
    import torch

    from specpilot.engine.runner import SystemRunner

    if _on_cpu(spec):
        torch.set_num_threads(CPU_THREADS)
    return SystemRunner(spec)
