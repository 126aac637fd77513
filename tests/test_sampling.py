"""The sampler's edge cases that the engine's and the server's tests reach only by chance."""

import torch

from inferlab.model.sampling import sample


def test_a_top_p_that_rounds_to_zero_in_float32_keeps_the_likeliest_token():
    """1e-50 is a valid top_p (in (0, 1]) but is 0 in float32: the draw must still have a
    token to take (the server answered 500 'invalid multinomial distribution' before)."""
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(2))
    gens = [torch.Generator().manual_seed(i) for i in range(3)]
    out = sample(logits, torch.tensor([1.0, 1.0, 2.0]), gens, torch.tensor([0, 5, 0]),
                 torch.tensor([1e-50, 1e-60, 1e-45], dtype=torch.float64))
    assert out == logits.argmax(-1).tolist()
