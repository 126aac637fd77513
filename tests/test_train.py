"""The training script's mechanics, on a few steps of a toy model: the corpus record, the
tokenizer round trip, determinism (same seed, same checkpoint) and the saved checkpoint giving
the logits of the model that saved it."""

import hashlib
import json

import pytest
import torch

from inferlab.model import bpe, corpus, train
from inferlab.model.config import ModelConfig
from inferlab.model.weights import load_checkpoint, load_tokenizer

pytest.importorskip("tokenizers")

TOY = ModelConfig.from_name("course-draft").scaled(n_layers=1, d_model=64, n_heads=4,
                                                     n_kv_heads=2, head_dim=16, ffn_dim=128,
                                                     vocab_size=300, max_seq_len=64)
PLAN = train.TrainConfig(steps=6, batch=2, seq_len=32, warmup=2, eval_every=3, eval_windows=2)


@pytest.fixture(scope="module")
def toy_data():
    """A tokenizer and token streams from the shipped validation text (no local stdlib needed)."""
    files = corpus.held_out("validation")[:6]
    tokenizer = bpe.train_tokenizer(corpus.documents(files), TOY.vocab_size)
    stream, val = train.token_stream(tokenizer, files[1:]), train.token_stream(tokenizer, files[:1])
    return tokenizer, stream, val


def _digest(model) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def test_split_is_by_path_and_documents_join_back_to_the_file():
    rows = corpus.manifest()
    assert {r["split"] for r in rows} == set(corpus.SPLITS)
    assert all(r["split"] == corpus.split_of(r["path"]) for r in rows)
    for doc in corpus.held_out("test")[:5]:
        pieces = corpus.split_top_level(doc.text)
        assert "".join(pieces) == doc.text and len(pieces) > 1
        assert all(p.startswith(("def ", "class ", "async def ", "@", "#")) for p in pieces[1:])


def test_shipped_held_out_text_is_the_recorded_bytes():
    recorded = {r["path"]: r for r in corpus.manifest()}
    for split in corpus.HELD_OUT:
        docs = corpus.held_out(split)
        assert {d.path for d in docs} == {p for p, r in recorded.items() if r["split"] == split}
        for doc in docs:
            assert corpus.sha256_of(doc.text.encode("utf-8")) == recorded[doc.path]["sha256"]


def test_a_differing_stdlib_is_reported_and_training_refuses(tmp_path, monkeypatch, capsys):
    doc = corpus.held_out("test")[0]
    (tmp_path / doc.path).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / doc.path).write_text(doc.text + "# changed\n", encoding="utf-8")
    (tmp_path / "extra.py").write_text("x = 1\n")
    problems = corpus.check_local_stdlib(tmp_path)
    assert f"{doc.path}: SHA-256 differs" in problems
    assert "extra.py: not in the recorded corpus" in problems
    assert any(p.endswith(": missing") for p in problems)
    monkeypatch.setattr(corpus, "stdlib_root", lambda: tmp_path)
    assert train.main(["--check"]) == 1
    assert train.main(["--steps", "1"]) == 1  # refuses without --allow-mismatch
    err = capsys.readouterr().err
    assert "differs from the recorded corpus" in err and "--allow-mismatch" in err


def test_tokenizer_round_trips_text_exactly_and_ends_documents_with_eos(toy_data):
    tokenizer = toy_data[0]
    eos = tokenizer.token_to_id(bpe.EOS_TOKEN)
    text = corpus.held_out("test")[0].text + "\t\u00e9\u4e2d \U0001f600\r\n  \n"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text
    ids = bpe.encode_documents(tokenizer, ["a = 1\n", "b = 2\n"])
    assert [d[-1] for d in ids] == [eos, eos] and eos == 0


def test_same_seed_same_checkpoint_and_another_seed_another(toy_data):
    _, stream, val = toy_data
    first, rows = train.train_model(TOY, stream, val, PLAN, progress=False)
    second, _ = train.train_model(TOY, stream, val, PLAN, progress=False)
    reseeded = train.TrainConfig(**{**PLAN.__dict__, "seed": 1})
    other, _ = train.train_model(TOY, stream, val, reseeded, progress=False)
    assert _digest(first) == _digest(second) != _digest(other)
    assert [r["step"] for r in rows] == [0, 3, 6] and rows[-1]["val_loss"] < rows[0]["val_loss"]


def test_saved_checkpoint_gives_identical_logits(tmp_path, toy_data):
    tokenizer, stream, val = toy_data
    model, _ = train.train_model(TOY, stream, val, PLAN, progress=False)
    path = train.save_course_model(model, tokenizer, tmp_path / "toy")
    assert {p.name for p in path.iterdir()} >= {"config.json", "model.safetensors",
                                                "tokenizer.json", "tokenizer_config.json"}
    hf = json.loads((path / "config.json").read_text())
    assert hf["torch_dtype"] == "float32" and hf["eos_token_id"] == 0
    loaded = load_checkpoint(path)
    assert loaded.dtype == torch.float32
    tokens = stream[None, :TOY.max_seq_len]
    with torch.no_grad():
        assert torch.equal(loaded(tokens), model(tokens))
    tok = load_tokenizer(path, model=loaded)
    assert tok.eos_token_id == 0 and tok.vocab_size == TOY.vocab_size


def test_learning_rate_warms_up_then_decays_to_its_floor():
    plan = train.TrainConfig(steps=100, lr=1e-3, warmup=10, final_lr_ratio=0.1)
    lrs = [train.learning_rate(s, plan) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert train.learning_rate(100, plan) == pytest.approx(1e-4)


def test_the_moe_trains_with_its_balancing_loss_and_saves_in_the_mixtral_layout(tmp_path,
                                                                               toy_data):
    from inferlab.model.moe import MoELlama, MoEModelConfig

    tokenizer, stream, val = toy_data
    toy = MoEModelConfig(**{**TOY.as_dict(), "ffn_dim": 64, "n_experts": 4,
                            "experts_per_token": 2, "name": "toy-moe"})
    model, rows = train.train_model(toy, stream, val, PLAN, progress=False)
    again, _ = train.train_model(toy, stream, val, PLAN, progress=False)
    assert isinstance(model, MoELlama) and _digest(model) == _digest(again)
    assert rows[-1]["val_loss"] < rows[0]["val_loss"]
    batch = stream[None, :33]
    loss, ce = train.training_loss(model, batch)  # cross-entropy plus the weighted balancing term
    assert float(loss) > ce == pytest.approx(float(train.window_loss(model, batch)))
    path = train.save_course_model(model, tokenizer, tmp_path / "toy-moe")
    assert json.loads((path / "config.json").read_text())["model_type"] == "mixtral"
    loaded = load_checkpoint(path)  # the one loader dispatches on model_type
    assert isinstance(loaded, MoELlama)
    with torch.no_grad():
        assert torch.equal(loaded(batch), model(batch))


def test_the_course_moe_has_the_targets_active_parameters():
    from inferlab.model.moe import course_moe_config

    moe, dense = course_moe_config(), ModelConfig.from_name("course-target")
    assert moe.ffn_dim * moe.experts_per_token == dense.ffn_dim
    assert (moe.n_layers, moe.d_model, moe.vocab_size) == (dense.n_layers, dense.d_model,
                                                           dense.vocab_size)
    with pytest.raises(ValueError, match="divisible"):
        course_moe_config(n_experts=3)


def test_a_merged_log_keeps_every_column(tmp_path):
    path = train.write_table([{"model": "a", "step": 0}, {"model": "b", "step": 1, "source": "x"}],
                             tmp_path / "log.csv")
    assert path.read_text().splitlines() == ["model,step,source", "a,0,", "b,1,x"]
