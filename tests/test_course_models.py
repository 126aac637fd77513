"""The committed course models: they load through the same path as a hub checkpoint, their
tokenizer round-trips the held-out text, and they end their own generations. The quality bars
on the whole test split (the target under half the unigram baseline's bits per byte, the draft
between them) are asserted by the model card (book/model_card.md), which every build executes
and which fails the build if a bar is missed: scoring the split again here took 30 to 40 s."""

import re
from pathlib import Path

import pytest
import torch

from inferlab.data import data_path
from inferlab.model import corpus
from inferlab.model.config import ModelConfig
from inferlab.model.generate import generate
from inferlab.model.weights import checkpoint_path, load_checkpoint, load_tokenizer

pytest.importorskip("tokenizers")
NAMES = ("course-target", "course-draft")
MB = 10**6


@pytest.fixture(scope="module")
def models():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is as fast, and steady on a busy machine
    yield {name: load_checkpoint(checkpoint_path(name)) for name in NAMES}
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer(models):
    return load_tokenizer(checkpoint_path("course-target"), model=models["course-target"])


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_checkpoints_have_the_hf_layout_the_preset_shapes_and_fit_the_budget(models):
    for name, model in models.items():
        path = checkpoint_path(name)
        assert path == data_path("models", name)
        files = {p.name for p in path.iterdir()}
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= files
        assert model.dtype == torch.float32
        preset = ModelConfig.from_name(name)
        assert model.config.as_dict() | {"name": ""} == preset.as_dict() | {"name": ""}
    target, draft = (models[n].config for n in NAMES)
    assert target.n_kv_heads < target.n_heads and target.n_layers >= 4  # GQA, several layers
    assert draft.n_layers <= 2 and draft.vocab_size == target.vocab_size
    assert (checkpoint_path("course-draft") / "tokenizer.json").read_bytes() == \
        (checkpoint_path("course-target") / "tokenizer.json").read_bytes()
    shipped = _size(data_path("models")) + _size(data_path("corpus"))
    assert shipped < 25 * MB, f"data/models + data/corpus hold {shipped / MB:.1f} MB"


def test_tokenizer_round_trips_every_held_out_file_exactly(tokenizer):
    for split in corpus.HELD_OUT:
        for doc in corpus.held_out(split):
            assert tokenizer.decode(tokenizer.encode(doc.text)) == doc.text, doc.path


def test_the_target_ends_definitions_with_the_end_of_sequence_token(models, tokenizer):
    docs = corpus.documents(corpus.held_out("test"))
    heads = [m.group(0) for d in docs
             if d.startswith("def ") and (m := re.match(r"[^\n]*\n[ \t]*\S+", d))][:6]
    eos = tokenizer.eos_token_id
    lengths = []
    for head in heads:
        ids = tokenizer.encode(head)
        out = generate(models["course-target"], torch.tensor(ids), 200, eos_token_id=eos,
                       temperature=0.7)[0]
        new = out[len(ids):].tolist()
        assert eos not in new[:-1]  # nothing after the end
        lengths.append(len(new) if new[-1] == eos else None)
    assert any(n is not None and n >= 10 for n in lengths), lengths  # a body, then the end
