"""Checkpoints in the Hugging Face layout: the tests write their own, offline, and load them back."""

import json
import sys

import pytest
import torch

from inferlab.model.generate import generate, generate_text, generate_without_cache
from inferlab.model.config import ModelConfig
from inferlab.model.llama import build_model
from inferlab.model.weights import (INDEX_NAME, SINGLE_NAME, Tokenizer, load_checkpoint,
    load_state_dict, load_tokenizer, save_checkpoint)

LLAMA = ModelConfig.from_name("tiny").scaled(n_layers=2, max_seq_len=128)
# A Qwen2-shaped toy: Q/K/V biases and an output projection tied to the embedding table.
QWEN = ModelConfig.from_name("qwen2.5-0.5b").scaled(
    n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=128, vocab_size=300,
    max_seq_len=128)


def _prompt(vocab, n=7, seed=5):
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(seed))


def _randomise_biases(model):
    with torch.no_grad():  # init_weights zeroes biases; make them count in the round trip
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0, 0.02, generator=torch.Generator().manual_seed(len(name)))
    return model


@pytest.mark.parametrize("config", [LLAMA, QWEN], ids=["llama", "qwen2-tied"])
@pytest.mark.parametrize("shard", [None, 40_000], ids=["single", "sharded"])
def test_round_trip_every_tensor_and_identical_generation(tmp_path, config, shard):
    model = _randomise_biases(build_model(config, seed=1))
    path = save_checkpoint(model, tmp_path / "ckpt", max_shard_bytes=shard)
    if shard is None:
        assert (path / SINGLE_NAME).is_file() and not (path / INDEX_NAME).exists()
    else:
        index = json.loads((path / INDEX_NAME).read_text())
        shards = set(index["weight_map"].values())
        assert len(shards) > 1 and all((path / s).is_file() for s in shards)
    loaded = load_checkpoint(path, dtype="float32")
    assert loaded.config.as_dict() | {"name": ""} == config.as_dict() | {"name": ""}
    original, back = model.state_dict(), loaded.state_dict()
    assert set(original) == set(back)
    for name, tensor in original.items():
        assert torch.equal(tensor, back[name]), name
    prompt = _prompt(config.vocab_size)
    assert torch.equal(generate(model, prompt, 12), generate(loaded, prompt, 12))
    assert torch.equal(generate(loaded, prompt, 12), generate_without_cache(loaded, prompt, 12))


def test_tied_checkpoint_stores_no_lm_head_and_loads_it_shared(tmp_path):
    path = save_checkpoint(build_model(QWEN, seed=2), tmp_path)
    assert "lm_head.weight" not in load_state_dict(path)
    model = load_checkpoint(path)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_dtype_choice_and_default_from_config(tmp_path):
    model = build_model(LLAMA, seed=3)
    path = save_checkpoint(model, tmp_path, dtype="bfloat16")
    assert json.loads((path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert load_checkpoint(path).dtype == torch.bfloat16  # the checkpoint's own dtype
    as_fp32 = load_checkpoint(path, dtype="float32")
    assert as_fp32.dtype == torch.float32
    expected = model.lm_head.weight.detach().to(torch.bfloat16).float()
    assert torch.equal(as_fp32.lm_head.weight, expected)


def test_resaving_with_fewer_shards_leaves_no_stale_files(tmp_path):
    model = build_model(LLAMA, seed=4)
    save_checkpoint(model, tmp_path, max_shard_bytes=40_000)
    save_checkpoint(model, tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == [SINGLE_NAME]
    assert not (tmp_path / INDEX_NAME).exists()
    load_checkpoint(tmp_path)


def test_clear_errors_for_broken_checkpoints(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_checkpoint(tmp_path)
    path = save_checkpoint(build_model(LLAMA, seed=5), tmp_path / "a")
    hf = json.loads((path / "config.json").read_text())
    hf["num_hidden_layers"] = 3  # the file says 3 layers, the weights hold 2
    (path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match="missing.*model.layers.2"):
        load_checkpoint(path)
    hf["num_hidden_layers"], hf["intermediate_size"] = 2, 100
    (path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match="shape"):
        load_checkpoint(path)
    (path / SINGLE_NAME).unlink()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_checkpoint(path)


def test_rope_scaling_warns_and_other_activations_refuse(tmp_path):
    path = save_checkpoint(build_model(LLAMA, seed=6), tmp_path)
    hf = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(hf | {"rope_scaling": {"rope_type": "llama3"}}))
    with pytest.warns(UserWarning, match="rope_scaling"):
        load_checkpoint(path)
    (path / "config.json").write_text(json.dumps(hf | {"hidden_act": "gelu"}))
    with pytest.raises(ValueError, match="silu"):
        load_checkpoint(path)


def _write_word_tokenizer(path, vocab_size):
    """A whitespace word-level tokenizer.json, built offline with the `tokenizers` package."""
    tokenizers = pytest.importorskip("tokenizers")
    words = ["<eos>", "<unk>"] + [f"w{i}" for i in range(vocab_size - 2)]
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)},
                                                           unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.decoder = None
    tok.add_special_tokens(["<eos>"])
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))


def test_tokenizer_and_generate_text_with_and_without_cache(tmp_path, monkeypatch):
    path = save_checkpoint(build_model(LLAMA, seed=7), tmp_path)
    _write_word_tokenizer(path, LLAMA.vocab_size)
    monkeypatch.setitem(sys.modules, "transformers", None)  # take the `tokenizers` path
    tokenizer = load_tokenizer(path)
    assert isinstance(tokenizer, Tokenizer) and tokenizer.source == "tokenizers"
    assert tokenizer.eos_token_id == 0
    assert tokenizer.encode("w1 w2 w3") == [3, 4, 5]
    model = load_checkpoint(path)
    cached = generate_text(model, tokenizer, "w1 w2 w3", max_new_tokens=10, stop_at_eos=False)
    recomputed = generate_text(model, tokenizer, "w1 w2 w3", max_new_tokens=10, use_cache=False,
                               stop_at_eos=False)
    assert cached == recomputed and len(cached.split()) == 10


def test_generate_text_stops_at_eos():
    model = build_model(LLAMA, seed=8)
    full = generate(model, torch.tensor([[5, 6, 7]]), 20)[0, 3:].tolist()

    class Fake:  # every id decodes to its own number; the fourth generated token ends the text
        eos_token_id = full[3]

        def encode(self, text):
            return [int(w) for w in text.split()]

        def decode(self, ids):
            return " ".join(map(str, ids))

    stop = full.index(Fake.eos_token_id)
    assert generate_text(model, Fake(), "5 6 7", max_new_tokens=20) == \
        " ".join(map(str, full[:stop]))
    assert generate_text(model, Fake(), "5 6 7", max_new_tokens=20, stop_at_eos=False) == \
        " ".join(map(str, full))


def test_missing_tokenizer_packages_give_a_clear_message(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(ImportError, match="pip install tokenizers"):
        load_tokenizer(tmp_path)


def test_transformers5_rope_parameters_layout_loads_its_theta(tmp_path):
    path = save_checkpoint(build_model(QWEN, seed=9), tmp_path)
    hf = json.loads((path / "config.json").read_text())
    theta = hf.pop("rope_theta")
    hf["rope_parameters"] = {"rope_theta": theta, "rope_type": "default"}
    (path / "config.json").write_text(json.dumps(hf))
    assert load_checkpoint(path).config.rope_theta == theta == QWEN.rope_theta
    hf["rope_parameters"] = {"rope_theta": theta, "rope_type": "yarn", "factor": 4.0}
    (path / "config.json").write_text(json.dumps(hf))
    with pytest.warns(UserWarning, match="rope_scaling"):
        load_checkpoint(path)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_logits_match_transformers_when_it_is_installed(tmp_path, family):
    """The cross-check against the reference implementation (skipped where transformers is absent)."""
    transformers = pytest.importorskip("transformers")
    kwargs = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    if family == "llama":
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kwargs, rope_theta=5e5))
    else:
        hf = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**kwargs, rope_theta=1e6,
                                                                     tie_word_embeddings=True))
    hf = _randomise_biases(hf.eval())
    hf.save_pretrained(str(tmp_path))
    ours = load_checkpoint(tmp_path, dtype="float32")
    tokens = _prompt(300, n=17)
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), hf(tokens).logits, atol=1e-5, rtol=1e-5)
    assert torch.equal(generate(ours, tokens, 8), generate_without_cache(ours, tokens, 8))


def test_a_tokenizer_json_is_read_with_tokenizers_even_where_transformers_is_installed(tmp_path):
    """Installing transformers (XGrammar brings it) changes no tokenization: a checkpoint with a
    tokenizer.json is read with tokenizers either way."""
    pytest.importorskip("transformers")
    _write_word_tokenizer(tmp_path, 50)
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.source == "tokenizers" and tokenizer.eos_token_id == 0
    ids = tokenizer.encode("w1 w2 w3")
    assert ids == [3, 4, 5] and tokenizer.decode(ids).split() == ["w1", "w2", "w3"]


def test_the_standard_file_wins_over_other_layouts_beside_it(tmp_path):
    model = build_model(LLAMA, seed=10)
    path = save_checkpoint(model, tmp_path)
    from safetensors.torch import save_file
    save_file({"tok_embeddings.weight": torch.zeros(3, 3)}, str(path / "consolidated.safetensors"))
    assert torch.equal(load_checkpoint(path).lm_head.weight, model.lm_head.weight)
