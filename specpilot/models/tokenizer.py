"""Tokenizer of a model directory, read with the `tokenizers` library (no transformers).

Owns: loading `tokenizer.json` (+ `tokenizer_config.json` for special tokens and the chat
template), encode/decode, the EOS ids, a fingerprint used to check that a drafter and a target
share a vocabulary, and rendering a chat template when the checkpoint has one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from specpilot.errors import CheckpointError


@dataclass
class Tokenizer:
    backend: HFTokenizer
    eos_ids: tuple[int, ...]
    bos_id: int | None
    chat_template: str | None
    path: Path

    @classmethod
    def from_dir(cls, path: str | Path, eos_ids: tuple[int, ...] = ()) -> "Tokenizer":
        path = Path(path)
        file = path / "tokenizer.json"
        if not file.is_file():
            raise CheckpointError(f"{path}: no tokenizer.json")
        try:
            backend = HFTokenizer.from_file(str(file))
        except Exception as err:  # the Rust side raises plain Exception subclasses
            raise CheckpointError(f"{file}: unreadable tokenizer ({str(err).splitlines()[0][:120]})") from None
        config = {}
        cfg_file = path / "tokenizer_config.json"
        if cfg_file.is_file():
            try:
                config = json.loads(cfg_file.read_text())
            except json.JSONDecodeError:
                raise CheckpointError(f"{cfg_file}: not valid JSON") from None
        eos = set(eos_ids)
        for key in ("eos_token", "pad_token"):
            tok = config.get(key)
            if isinstance(tok, dict):
                tok = tok.get("content")
            if key == "eos_token" and tok is not None and backend.token_to_id(tok) is not None:
                eos.add(backend.token_to_id(tok))
        bos_tok = config.get("bos_token")
        if isinstance(bos_tok, dict):
            bos_tok = bos_tok.get("content")
        bos = backend.token_to_id(bos_tok) if bos_tok else None
        return cls(backend, tuple(sorted(eos)), bos, config.get("chat_template"), path)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=False)

    def fingerprint(self) -> str:
        """Hash of the vocabulary (token -> id); equal fingerprints mean interchangeable ids."""
        vocab = sorted(self.backend.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
        return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]

    def render_chat(self, user_message: str) -> str | None:
        """The prompt text for one user turn under the checkpoint's chat template, or None."""
        if not self.chat_template:
            return None
        try:
            import jinja2
        except ImportError:
            raise CheckpointError(f"{self.path}: has a chat template but jinja2 is not installed") from None
        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
        template = env.from_string(self.chat_template)
        return template.render(
            messages=[{"role": "user", "content": user_message}],
            add_generation_prompt=True,
            bos_token="",
            eos_token="",
        )


def check_same_vocabulary(target: Tokenizer, drafter: Tokenizer) -> None:
    if target.fingerprint() != drafter.fingerprint():
        raise CheckpointError(
            f"drafter tokenizer ({drafter.path}) differs from the target's ({target.path}); "
            "a draft model must share the target's vocabulary"
        )
