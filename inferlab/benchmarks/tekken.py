"""A real byte-level BPE vocabulary for the benchmarks: Mistral's Tekken, read without its library.

Tekken is a byte-level BPE tokenizer of 131,072 ids that Mistral's ``mistral_common`` package
ships for its models as JSON (``mistral_common/data/tekken_240911.json`` in its wheel): a
``config`` with the split ``pattern``, ``default_vocab_size`` and ``default_num_special_tokens``,
and a ``vocab`` list of ``{"rank", "token_bytes" (base64), "token_str"}`` in rank order, the
first 256 ranks being the single bytes. The model's ids are the special tokens first (0 to
``num_special - 1``), then the BPE ranks in order, cut at ``default_vocab_size``; a file without
a ``special_tokens`` list (allowed up to version v7; this one is v3) uses the fixed list whose id
2 is ``</s>`` (``Tekkenizer.from_file`` and ``DEPRECATED_SPECIAL_TOKENS`` in mistral_common
1.12.0, ``tokens/tokenizers/tekken.py``).

Encoding is tiktoken's byte-level BPE, which ``mistral_common`` calls: split the text with the
pattern (the ``regex`` package, for ``\\p{L}`` and friends); a piece whose UTF-8 bytes are a
token is that token, and in any other piece merge, again and again, the adjacent pair whose
concatenation has the lowest rank, until no adjacent pair is a token. That is all
``bpe_merge`` does; the benchmark uses it so that XGrammar's matcher is fed the tokens a real
tokenizer would produce.
"""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import regex

TEKKEN_MEMBER = "mistral_common/data/tekken_240911.json"  # inside a mistral_common wheel
LEGACY_EOS_ID = 2  # "</s>" in mistral_common's DEPRECATED_SPECIAL_TOKENS (files up to v7)


def bpe_merge(piece: bytes, ranks: dict[bytes, int]) -> list[bytes]:
    """``piece`` as BPE tokens: start from single bytes and merge the lowest-ranked adjacent
    pair (leftmost on a tie) until no adjacent pair is in ``ranks``."""
    parts = [piece[i:i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        pairs = [(ranks.get(parts[i] + parts[i + 1]), i) for i in range(len(parts) - 1)]
        best = min(((r, i) for r, i in pairs if r is not None), default=None)
        if best is None:
            break
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts


@dataclass(frozen=True)
class BPEVocab:
    """A byte-level BPE vocabulary: ``token_bytes[i]`` is what id ``i`` decodes to (b"" for a
    special token), ``ranks`` maps a BPE token's bytes to its rank, and the id of rank ``r`` is
    ``num_special + r``."""

    token_bytes: list[bytes]
    ranks: dict[bytes, int]
    pattern: str
    num_special: int
    eos_id: int
    source: dict

    def __post_init__(self):
        missing = [b for b in range(256) if bytes([b]) not in self.ranks]
        if missing:
            raise ValueError(f"byte-level BPE needs every byte as a token; missing {missing[:5]}")

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)

    def encode(self, text: str) -> list[int]:
        ids = []
        for piece in regex.findall(self.pattern, text):
            b = piece.encode("utf-8")
            parts = [b] if b in self.ranks else bpe_merge(b, self.ranks)  # tiktoken's shortcut
            ids += [self.num_special + self.ranks[p] for p in parts]
        return ids

    def decode(self, ids) -> str:
        return b"".join(self.token_bytes[i] for i in ids).decode("utf-8", errors="replace")


def from_tekken_json(data: dict, source: dict | None = None) -> BPEVocab:
    """A ``BPEVocab`` from a Tekken file's parsed JSON, checked against its own structure."""
    config, vocab = data["config"], data["vocab"]
    num_special, size = config["default_num_special_tokens"], config["default_vocab_size"]
    inner = size - num_special
    if len(vocab) < inner:
        raise ValueError(f"{len(vocab)} BPE ranks, fewer than {inner}")
    ranks, token_bytes = {}, [b""] * num_special
    for i, entry in enumerate(vocab[:inner]):
        if entry["rank"] != i:
            raise ValueError(f"entry {i} has rank {entry['rank']}: the list is not in rank order")
        b = base64.b64decode(entry["token_bytes"])
        ranks[b] = i
        token_bytes.append(b)
    if len(ranks) != inner:
        raise ValueError("two ranks share one token")
    specials = data.get("special_tokens")
    eos = LEGACY_EOS_ID if not specials else \
        next(t["rank"] for t in specials if t["token_str"] == "</s>")
    return BPEVocab(token_bytes, ranks, config["pattern"], num_special, eos,
                    {**(source or {}), "version": config.get("version"), "vocab_size": size,
                     "num_special_tokens": num_special})


def read_tekken(path: str | Path) -> BPEVocab:
    """Tekken's vocabulary from its JSON file, or from inside a mistral_common wheel (a zip)."""
    path = Path(path)
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            raw = z.read(TEKKEN_MEMBER)
        source = {"file": path.name, "member": TEKKEN_MEMBER}
    else:
        raw = path.read_bytes()
        source = {"file": path.name}
    source["sha256"] = hashlib.sha256(raw).hexdigest()
    return from_tekken_json(json.loads(raw), source)
