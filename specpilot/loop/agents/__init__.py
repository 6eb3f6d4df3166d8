"""Proposer agents, one per file, behind `base.Proposer`; importing this package registers them.

knob (engine settings), kernel (launch configs, GPU), integration (stacks of measured gains),
coding (an external coding-agent CLI in a worktree). Which run, and in which order (the order in
which the loop takes their proposals, round-robin), is `LoopConfig.agents`.
"""

from specpilot.loop.agents import coding, integration, kernel, knob  # noqa: F401
from specpilot.loop.agents.base import PROPOSERS, Proposal, Proposer, register  # noqa: F401
