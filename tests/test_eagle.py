"""The EAGLE-style draft head: speculation with it is exact, its cache holds only true features,
it saves and loads, and its training loss lines features up with the tokens that follow them."""

import json

import pytest
import torch

from inferlab.model.config import ModelConfig
from inferlab.model.eagle import (EagleDrafter, EagleHead, FeatureTarget, head_loss, load_head,
                                  save_head, target_features)
from inferlab.model.generate import generate
from inferlab.model.llama import build_model
from inferlab.model.speculative import speculative_generate
from inferlab.model.weights import checkpoint_path


@pytest.fixture(scope="module")
def target():
    small = ModelConfig(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, ffn_dim=128,
                        vocab_size=128, max_seq_len=256, name="test-target")
    return build_model(small, seed=3)


def _head(target, seed=0):
    torch.manual_seed(seed)
    return EagleHead(target.config, target.model.embed_tokens, target.lm_head).eval()


def _spec(target, head, prompt, n, k, temperature=0.0, seed=0):
    runner = FeatureTarget(target, len(prompt) + n + k)
    return speculative_generate(target, EagleDrafter(head, runner), prompt, n, k=k,
                                temperature=temperature, seed=seed, target_cache=runner)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_speculation_with_the_head_is_the_targets_greedy_output(target, k):
    prompt = torch.randint(0, target.config.vocab_size, (12,), generator=torch.Generator()
                           .manual_seed(k)).tolist()
    plain = generate(target, torch.tensor(prompt), 40)[0].tolist()
    tokens, stats = _spec(target, _head(target, seed=k), prompt, 40, k)
    assert tokens == plain
    assert stats.emitted >= 40


def test_a_head_that_copies_the_target_is_always_accepted(target):
    """Plant the answer: a drafter that proposes the target's own greedy tokens must have every
    draft accepted, so the loop's bookkeeping (features, rollback) is aligned."""
    prompt = list(range(5, 15))
    plain = generate(target, torch.tensor(prompt), 30)[0].tolist()

    class Oracle:
        def propose(self, tokens, k, temperature=0.0, generator=None):
            n = len(tokens)
            return plain[n:n + k], None

        def keep(self, n):
            pass

    runner = FeatureTarget(target, 60)
    tokens, stats = speculative_generate(target, Oracle(), prompt, 30, k=4, target_cache=runner)
    assert tokens == plain and stats.acceptance_rate == 1.0
    # the runner's features are the target's own for every cached position
    _, h = target_features(target, torch.tensor([tokens[:runner.cache.length]]))
    assert torch.allclose(runner.features[:runner.cache.length], h[0], atol=1e-5)


def test_the_drafter_keeps_only_slots_fed_with_the_targets_features(target):
    head = _head(target)
    runner = FeatureTarget(target, 64)
    prompt = list(range(20, 36))
    runner.forward(prompt[:-1], 0)
    drafter = EagleDrafter(head, runner)
    drafted, q = drafter.propose(prompt, 4)
    assert len(drafted) == 4 and q is None
    assert drafter.cache.length == len(prompt) - 1
    # the first draft equals the head run afresh over the true pairs, without any cache
    f = head(torch.tensor([prompt[1:]]), runner.features[:len(prompt) - 1][None],
             torch.arange(len(prompt) - 1))
    assert int(head.logits(f)[0, -1].argmax()) == drafted[0]


def test_sampled_drafts_come_with_their_distributions(target):
    prompt = list(range(40, 50))
    tokens, stats = _spec(target, _head(target), prompt, 20, 3, temperature=1.0, seed=1)
    assert len(tokens) == 30 and stats.verifications > 0


def test_head_round_trips_through_its_files(target, tmp_path):
    head = _head(target, seed=5)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    save_head(head, tmp_path, "tiny")
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["target_model"] == "tiny" and cfg["num_hidden_layers"] == 1
    back = load_head(tmp_path, target)
    for (n, a), (_, b) in zip(head.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), n
    assert not any(n.startswith(("embed", "lm_head")) for n in back.state_dict())


def test_loss_step_one_scores_the_next_feature(target):
    """A head whose output is the feature one step ahead scores zero feature loss at step 1."""
    x = torch.randint(0, target.config.vocab_size, (2, 16))
    logits, feats = target_features(target, x)

    class Perfect(EagleHead):
        def forward(self, tokens, features, positions, cache=None):
            return feats[:, positions + 1]

    head = Perfect(target.config, target.model.embed_tokens, target.lm_head)
    out = head_loss(head, x, feats, logits, unroll=1)
    assert out["top1_step1"] == 1.0
    with torch.no_grad():
        entropy = -(torch.softmax(logits[:, 1:], -1) * torch.log_softmax(logits[:, 1:], -1)).sum(-1)
        assert float(out["loss"]) == pytest.approx(0.1 * float(entropy.mean()), rel=1e-4)


def test_committed_head_loads_on_the_course_target():
    path = checkpoint_path("course-target").parent / "course-eagle"
    if not (path / "config.json").exists():
        pytest.skip("no committed head")
    from inferlab.model.weights import load_checkpoint

    target = load_checkpoint(checkpoint_path("course-target"))
    head = load_head(path, target)
    assert (path / "model.safetensors").stat().st_size < 4e6
    prompt = list(range(100, 120))
    plain = generate(target, torch.tensor(prompt), 24)[0].tolist()
    tokens, _ = _spec(target, head, prompt, 24, 4)
    assert tokens == plain


def test_a_one_token_prompt_drafts_nothing_at_first_and_stays_exact(target):
    plain = generate(target, torch.tensor([7]), 12)[0].tolist()
    tokens, stats = _spec(target, _head(target), [7], 12, 3)
    assert tokens == plain and stats.drafted[0] == 0
