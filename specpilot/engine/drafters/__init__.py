"""Drafters, one per file, behind `base.Drafter`; `engine.session` builds them from a `System`."""

from specpilot.engine.drafters.base import Drafter, DrafterSettings  # noqa: F401
