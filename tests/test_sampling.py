"""Token sampling: greedy, filters, seeds, repetition / presence / frequency penalties, the sampled
distribution, and the reported log-probabilities."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from service.engine.sampling import (
    SamplingParams,
    TokenSampler,
    apply_presence_frequency_penalties,
    logprobs,
    prompt_token_logprobs,
    softmax,
    token_logprob,
)

LOGITS = np.array([2.0, 1.0, 0.5, 3.0, -1.0, 0.0], dtype=np.float32)  # argmax = 3


def draws(params: SamplingParams, n: int, logits: np.ndarray = LOGITS) -> list[int]:
    sampler = TokenSampler(params)
    return [sampler.next_token(logits, []) for _ in range(n)]


def test_greedy_is_argmax() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        logits = rng.normal(size=50).astype(np.float32)
        assert TokenSampler(SamplingParams(temperature=0.0)).next_token(logits, []) == int(np.argmax(logits))
        assert TokenSampler(SamplingParams(greedy=True)).next_token(logits, []) == int(np.argmax(logits))


def test_params_flags() -> None:
    assert SamplingParams(temperature=0).is_greedy
    assert not SamplingParams().is_greedy
    assert SamplingParams(seed=1).is_deterministic and not SamplingParams().is_deterministic
    with pytest.raises(AssertionError):
        SamplingParams(top_p=0.0)


@pytest.mark.parametrize("temperature", [0.1, 1.0, 5.0, 100.0])
def test_top_k_one_equals_greedy_at_any_temperature(temperature: float) -> None:
    assert set(draws(SamplingParams(temperature=temperature, top_k=1, seed=3), 50)) == {3}


def test_same_seed_same_draws_and_different_seeds_differ() -> None:
    params = SamplingParams(temperature=1.5, seed=1234)
    assert draws(params, 200) == draws(params, 200)
    assert draws(params, 200) != draws(SamplingParams(temperature=1.5, seed=4321), 200)


def test_seeded_sequence_ignores_other_samplers() -> None:
    """Interleaving another sequence's draws (as in a shared batch) does not shift a seeded stream."""
    alone = draws(SamplingParams(seed=7), 100)
    mine, other = TokenSampler(SamplingParams(seed=7)), TokenSampler(SamplingParams(seed=8))
    interleaved = []
    for _ in range(100):
        other.next_token(LOGITS, [])
        interleaved.append(mine.next_token(LOGITS, []))
    assert interleaved == alone


def test_draws_stay_inside_top_k() -> None:
    counts = Counter(draws(SamplingParams(temperature=5.0, top_k=3, seed=0), 3000))
    assert set(counts) == {3, 0, 1}  # the three highest logits, each drawn at a high temperature


def test_draws_stay_inside_top_p_nucleus() -> None:
    logits = np.log(np.array([0.05, 0.5, 0.3, 0.1, 0.05]))
    # Sorted: 0.5, 0.3 (cum 0.8), 0.1 (cum 0.9): the smallest set with mass >= 0.85 is {1, 2, 3}.
    counts = Counter(draws(SamplingParams(top_p=0.85, seed=0), 3000, logits))
    assert set(counts) == {1, 2, 3}
    # Renormalised inside the nucleus: 0.5/0.9, 0.3/0.9, 0.1/0.9.
    assert counts[1] / 3000 == pytest.approx(0.5 / 0.9, abs=0.04)
    # A tiny top_p still keeps one token: the most likely.
    assert set(draws(SamplingParams(top_p=1e-6, seed=0), 50, logits)) == {1}


def test_top_k_and_top_p_combine() -> None:
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1]))
    # top_k=3 renormalises to 4/9, 3/9, 2/9; top_p=0.7 then keeps {0, 1} (cum 7/9).
    assert set(draws(SamplingParams(top_k=3, top_p=0.7, seed=0), 2000, logits)) == {0, 1}


def test_repetition_penalty_lowers_seen_tokens() -> None:
    logits = np.array([2.0, 2.0, -1.0, -1.0])
    penalised = TokenSampler(SamplingParams(repetition_penalty=2.0, seed=0))
    counts = Counter(penalised.next_token(logits, [0, 2, 0]) for _ in range(4000))
    assert counts[0] < counts[1] / 2  # seen positive logit: 2 -> 1
    assert counts[2] < counts[3]  # seen negative logit: -1 -> -2
    # Greedy flips to the unseen token of equal logit.
    assert TokenSampler(SamplingParams(temperature=0, repetition_penalty=1.5)).next_token(logits, [0]) == 1
    assert np.array_equal(logits, [2.0, 2.0, -1.0, -1.0])  # the caller's logits are untouched


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_frequencies_follow_softmax_of_scaled_logits(temperature: float) -> None:
    n = 8_000
    counts = Counter(draws(SamplingParams(temperature=temperature, seed=42), n))
    expected = softmax(LOGITS / temperature)
    observed = np.array([counts[i] / n for i in range(len(LOGITS))])
    np.testing.assert_allclose(observed, expected, atol=0.03)  # ~5 sigma at the worst p


def test_softmax_and_logprobs_are_stable() -> None:
    big = np.array([1000.0, 1000.0, -1000.0])
    assert np.allclose(softmax(big), [0.5, 0.5, 0.0])
    lp = logprobs(big)
    assert np.all(np.isfinite(lp[:2])) and lp[0] == pytest.approx(np.log(0.5))
    batch = np.random.default_rng(0).normal(size=(3, 7))
    np.testing.assert_allclose(np.exp(logprobs(batch)).sum(axis=-1), 1.0)
    np.testing.assert_allclose(logprobs(batch), np.log(softmax(batch)))


def test_masked_logits_are_never_drawn() -> None:
    logits = np.array([0.0, -np.inf, 0.0, -np.inf])
    assert set(draws(SamplingParams(seed=0), 500, logits)) == {0, 2}


def test_presence_and_frequency_penalties_follow_openai() -> None:
    # OpenAI: logit[j] -= presence * (count[j] > 0) + frequency * count[j], over generated tokens only.
    scores = LOGITS.astype(np.float64).copy()
    out = apply_presence_frequency_penalties(scores.copy(), [3, 3, 0], presence=0.5, frequency=0.25)
    expected = scores.copy()
    expected[3] -= 0.5 + 0.25 * 2
    expected[0] -= 0.5 + 0.25 * 1
    np.testing.assert_allclose(out, expected)
    # Negative values encourage repetition; zeros leave the row as it is.
    assert apply_presence_frequency_penalties(scores.copy(), [1], -1.0, 0.0)[1] == scores[1] + 1.0
    np.testing.assert_array_equal(apply_presence_frequency_penalties(scores.copy(), [3], 0.0, 0.0), scores)


def test_presence_penalty_moves_greedy_off_a_generated_token() -> None:
    sampler = TokenSampler(SamplingParams(temperature=0, presence_penalty=2.0))
    assert sampler.next_token(LOGITS, [3], generated_ids=[]) == 3  # a prompt token: not penalised
    assert sampler.next_token(LOGITS, [3], generated_ids=[3]) == 0  # 3 - 2 < 2.0


def test_zero_penalties_keep_seeded_draws_identical() -> None:
    ids = [3, 0, 3, 1]
    plain = TokenSampler(SamplingParams(seed=5))
    zero = TokenSampler(SamplingParams(seed=5, presence_penalty=0.0, frequency_penalty=0.0))
    assert [plain.next_token(LOGITS, ids) for _ in range(50)] == [
        zero.next_token(LOGITS, ids, generated_ids=ids) for _ in range(50)
    ]


def test_token_logprob_is_the_raw_log_softmax_with_top_n() -> None:
    entry = token_logprob(LOGITS, 0, top_n=3)
    row = logprobs(LOGITS)
    assert entry.token_id == 0 and entry.logprob == pytest.approx(row[0])
    assert [i for i, _ in entry.top] == [3, 0, 1]  # the three best, most likely first
    assert [v for _, v in entry.top] == pytest.approx([row[3], row[0], row[1]])
    assert token_logprob(LOGITS, 4, top_n=0).top == ()
    assert len(token_logprob(LOGITS, 4, top_n=100).top) == len(LOGITS)


def test_prompt_token_logprobs_score_each_token_from_the_row_before() -> None:
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(4, 6))  # (T, V)
    prompt = [2, 5, 0, 1]
    entries = prompt_token_logprobs(logits, prompt, top_n=2)
    assert entries[0].token_id == 2 and entries[0].logprob is None and entries[0].top == ()
    for t in range(1, 4):
        assert entries[t].token_id == prompt[t]
        assert entries[t].logprob == pytest.approx(logprobs(logits[t - 1])[prompt[t]])
        assert len(entries[t].top) == 2


def test_logit_bias_adds_to_the_logits_before_the_pick() -> None:
    assert draws(SamplingParams(temperature=0, logit_bias=((1, 5.0),)), 1) == [1]  # 1 + 5 beats 3
    assert draws(SamplingParams(temperature=0, logit_bias=((3, -100.0),)), 1) == [0]  # the argmax banned
    sampler = TokenSampler(SamplingParams(logit_bias=((4, 2.5),)))
    scores = sampler.scores(LOGITS, [])
    assert scores[4] == pytest.approx(LOGITS[4] + 2.5) and scores[0] == pytest.approx(LOGITS[0])
    # the sampled distribution is the biased softmax
    counts = Counter(draws(SamplingParams(seed=1, logit_bias=((4, 4.0),)), 20_000))
    biased = LOGITS.astype(np.float64).copy()
    biased[4] += 4.0
    assert counts[4] / 20_000 == pytest.approx(softmax(biased)[4], abs=0.015)


def test_allowed_mask_keeps_draws_inside_it() -> None:
    allowed = np.array([True, False, True, False, False, True])
    sampler = TokenSampler(SamplingParams(seed=3, temperature=1.5))
    picks = {sampler.next_token(LOGITS, [], (), allowed) for _ in range(500)}
    assert picks <= {0, 2, 5} and len(picks) == 3
    greedy = TokenSampler(SamplingParams(temperature=0))
    assert greedy.next_token(LOGITS, [], (), allowed) == 0  # the best allowed one, not 3


def test_extreme_penalties_and_temperatures_stay_finite() -> None:
    """A repetition penalty of 5e-324 divides a seen positive logit into infinity, a tiny temperature the
    rest: the sampler still picks a token (the one the order says), never NaN or an error."""
    for params in (
        SamplingParams(repetition_penalty=5e-324, temperature=0),
        SamplingParams(repetition_penalty=5e-324, seed=1),
        SamplingParams(repetition_penalty=5e-324, temperature=1e-300, seed=1, top_p=0.5),
    ):
        sampler = TokenSampler(params)
        assert sampler.next_token(LOGITS, [0, 3]) in (0, 3)  # the seen positive logits went to the top
