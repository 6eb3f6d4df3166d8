"""Drafters, one per file, behind `base.Drafter`; importing this package registers them."""

from specpilot.engine.drafters import dflash, draft_model, eagle3, ngram  # noqa: F401
from specpilot.engine.drafters.base import DRAFTERS, Drafter, register  # noqa: F401
