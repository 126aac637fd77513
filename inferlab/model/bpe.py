"""The course's tokenizer: byte-level byte-pair encoding, trained with the ``tokenizers`` package.

Byte-pair encoding (Sennrich et al. 2016) starts from single symbols and repeatedly merges the
most frequent adjacent pair into a new token until the vocabulary is full. The byte-level
variant of GPT-2 (Radford et al. 2019) starts from the 256 bytes, so every string, in any
script, encodes without an unknown token and decodes back to exactly the same string. One
special token, ``<|endoftext|>``, ends every document: a model trained on documents followed by
it learns to emit it when a text is complete, which is how generation knows to stop.

``save_tokenizer`` writes ``tokenizer.json`` (the ``tokenizers`` format, which
``transformers`` reads too) and a ``tokenizer_config.json`` that names the end-of-sequence
token and asks ``transformers`` not to "clean up" spaces on decoding (that would change code).
"""

from __future__ import annotations

import json
from pathlib import Path

from inferlab.model.chat_template import CHAT_TEMPLATE

EOS_TOKEN = "<|endoftext|>"


def _require_tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise ImportError("training the course's tokenizer needs the `tokenizers` package: "
                          "run `pip install tokenizers`") from None
    return tokenizers


def train_tokenizer(texts, vocab_size: int):
    """A byte-level BPE ``tokenizers.Tokenizer`` of ``vocab_size`` tokens, ``EOS_TOKEN`` as id 0."""
    tk = _require_tokenizers()
    tokenizer = tk.Tokenizer(tk.models.BPE())
    # No prefix space and no regex changes: decoding must give back the exact bytes.
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS_TOKEN], show_progress=False,
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(list(texts), trainer)
    return tokenizer


def encode_documents(tokenizer, texts) -> list[list[int]]:
    """Each text's token ids followed by the end-of-sequence id."""
    eos = tokenizer.token_to_id(EOS_TOKEN)
    return [enc.ids + [eos] for enc in tokenizer.encode_batch(list(texts))]


def save_tokenizer(tokenizer, path: str | Path) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into the directory ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS_TOKEN,
              "bos_token": None, "pad_token": None, "unk_token": None,
              "clean_up_tokenization_spaces": False, "add_bos_token": False,
              "add_eos_token": False, "chat_template": CHAT_TEMPLATE}
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n",
                                                encoding="utf-8")
    return path
