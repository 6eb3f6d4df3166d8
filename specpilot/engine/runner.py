"""`SystemRunner`: one system of one deployment behind the controller's worker contract.

The controller builds it inside an isolated worker process from a `RunnerSpec`-like object with
`deployment` (path or shipped name), `system` (knob dict incl. name) and `device`, then calls
`warmup` and `generate`. Timing is measured by the controller from outside this process.
"""

from __future__ import annotations

from specpilot.config import System, load_deployment
from specpilot.engine.session import Session


class SystemRunner:
    def __init__(self, spec):
        deployment = load_deployment(spec.deployment)
        knobs = dict(spec.system)
        name = knobs.pop("name", "candidate")
        base = deployment.stock.knobs()
        base.update(knobs)
        self.system = System.from_dict(base, name=name)
        self.session = Session.load(deployment, device=getattr(spec, "device", None))
        self.generator = self.session.generator(self.system)

    def warmup(self, prompts: list[list[int]], max_new_tokens: int) -> None:
        self.generate(prompts, max_new_tokens)

    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Outputs per prompt; prompts run in batches of the deployment's regime."""
        B = self.session.deployment.regime.batch
        outputs: list[list[int]] = []
        for i in range(0, len(prompts), B):
            outputs += self.generator.generate(prompts[i : i + B], max_new_tokens).outputs
        return outputs
