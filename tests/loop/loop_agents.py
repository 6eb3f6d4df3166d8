"""A scripted proposer for the loop's tests: fixed knob changes, in order, for every round.

Loaded by name as a plug-in (`--agents loop_agents:ScriptedAgent`), also in `specpilot run`
subprocesses (the test puts this folder on PYTHONPATH).
"""

from __future__ import annotations

from specpilot.config import System
from specpilot.loop.agents.base import Proposal, Proposer, ProposerContext
from specpilot.loop.systems import Candidate, short_name

MOVES = (
    {"drafter": "model", "depth": 2, "topk": 2, "tree_budget": 3},
    {"drafter": "model", "depth": 3, "topk": 1, "tree_budget": 3},
    {"drafter": "model", "depth": 1, "topk": 1, "tree_budget": 1},
)


class ScriptedAgent(Proposer):
    name = "scripted"

    def propose(self, ctx: ProposerContext) -> list[Proposal]:
        inc = ctx.incumbent.candidate
        base = inc.system.knobs()
        out = []
        for move in MOVES:
            system = System.from_dict({**base, **move}, name="x")
            diff = {k: [base[k], v] for k, v in move.items() if base[k] != v}
            out.append(Proposal(self.name, Candidate(system.with_changes(name=short_name(self.name, diff))),
                                "scripted move", None))
        return out
