"""Train a byte-level BPE tokenizer with the `tokenizers` library (deterministic for a corpus).

The only special token is EOS `<|endoftext|>` (id 0), appended after every training document.
`tokenizer_config.json` names `PreTrainedTokenizerFast` so transformers loads tokenizer.json as
is, instead of rebuilding a family tokenizer (e.g. Qwen2's) with different pre-tokenization.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS = "<|endoftext|>"


def train_bpe(documents: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(documents, trainer=trainer, length=len(documents))
    return tok


def save_tokenizer(tok: Tokenizer, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "bos_token": None,
              "model_max_length": 4096}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from corpus import build_corpus

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", type=Path, help="directory to write tokenizer.json into")
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--python-bytes", type=int, default=8_000_000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    corpus = build_corpus(python_bytes=a.python_bytes, english_chars=1_000_000, seed=a.seed)
    print(json.dumps(corpus.sources, indent=1))
    save_tokenizer(train_bpe(corpus.documents, a.vocab_size), a.out)
