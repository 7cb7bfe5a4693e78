"""A trained reward model as a judge (`--judge rm:<folder>`), through the same cache and interface."""

import torch

import reward
from judge import JudgeState


def test_reward_model_judge_scores_compares_and_caches(tmp_path):
    torch.manual_seed(0)
    rm, tok = reward.RewardModel.from_base("tiny")
    rm.save(tmp_path / "rm", tok, {"heldout_accuracy": None})
    state = JudgeState(
        "Anchor", "emotional validator: names feelings", "I lost my keys again.", [], ""
    )
    judge = reward.RMJudge(str(tmp_path / "rm"), tmp_path / "cache.jsonl")
    a, b = "That sounds so frustrating.", "Buy a key tracker today."
    s_a, s_b = judge.score(state, a), judge.score(state, b)
    assert 0.0 < s_a < 1.0 and 0.0 < s_b < 1.0 and s_a != s_b
    v, w = judge.compare(state, a, b), judge.compare(state, b, a)
    assert v.preferred == (0 if s_a > s_b else 1) and w.preferred == 1 - v.preferred
    assert abs(v.p_first + w.p_first - 1.0) < 1e-9  # symmetric by construction
    # The same judgement from a fresh judge on the same cache never reaches the model again.
    again = reward.RMJudge(str(tmp_path / "rm"), tmp_path / "cache.jsonl")
    assert again.score(state, a) == s_a and again.backend_calls == 0
