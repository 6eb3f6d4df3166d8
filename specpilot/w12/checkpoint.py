"""Placeholder until the W12 format lands: no directory is a W12 checkpoint yet."""

from pathlib import Path


def is_w12_checkpoint(path: str | Path) -> bool:
    return False


def read_w12_tensors(path: str | Path) -> dict:
    return {}
