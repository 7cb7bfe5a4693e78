"""Tests for reward.py: the Bradley-Terry loss by hand, the reward model on the tiny random Llama
(padding, truncation, learning a synthetic preference, save/load), and the format reward."""

import copy
import json
import math
import random
from pathlib import Path

import pytest
import torch

import data
import judge_eval
import reward
import sampler
from simulate import JudgeState

HERE = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Run this file's tiny-model work on one intra-op thread, then restore the setting.

    A 64-wide model's matmuls are far too small to split across threads; on a busy 2-core machine
    the threads mostly wait for each other and a training step gets ~50x slower.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_rm():
    torch.manual_seed(0)                                           # the head's random init
    return reward.RewardModel.from_base("tiny")


def chat(context, reply, history=()):
    return reward.rm_messages(JudgeState("Anchor", "A calm listener who validates feelings.", context,
                                         list(history)), reply)


# ---------------------------------------------------------------------------------------------
# Bradley-Terry loss
# ---------------------------------------------------------------------------------------------

def test_bt_loss_is_log2_for_equal_rewards():
    for value in (-3.0, 0.0, 0.7, 12.0):
        r = torch.full((5,), value)
        assert reward.bradley_terry_loss(r, r.clone()).item() == pytest.approx(math.log(2), abs=1e-6)


def test_bt_loss_hand_computed():
    # margins r_c - r_r = [2 - 0, 0 - 1] = [2, -1]
    # -log sigmoid(2)  = log(1 + e^-2) = log(1.135335) = 0.126928
    # -log sigmoid(-1) = log(1 + e^1)  = log(3.718282) = 1.313262
    # mean = (0.126928 + 1.313262) / 2 = 0.720095
    r_c = torch.tensor([2.0, 0.0])
    r_r = torch.tensor([0.0, 1.0])
    assert reward.bradley_terry_loss(r_c, r_r).item() == pytest.approx(0.720095, abs=1e-5)
    # Far from zero the loss stays finite and exact: -log sigmoid(-100) = 100 (naive log(sigmoid) = inf).
    assert reward.bradley_terry_loss(torch.tensor([0.0]), torch.tensor([100.0])).item() == pytest.approx(100.0)


def test_bt_loss_gradient_pushes_chosen_up_and_rejected_down():
    r_c = torch.tensor([2.0, 0.0], requires_grad=True)
    r_r = torch.tensor([0.0, 1.0], requires_grad=True)
    reward.bradley_terry_loss(r_c, r_r).backward()
    # d loss / d r_c_i = -(1 - sigmoid(m_i)) / N: margin 2 -> -(1 - 0.880797) / 2 = -0.059601,
    # margin -1 -> -(1 - 0.268941) / 2 = -0.365529; d loss / d r_r = the opposite.
    assert r_c.grad.tolist() == pytest.approx([-0.059601, -0.365529], abs=1e-5)
    assert r_r.grad.tolist() == pytest.approx([0.059601, 0.365529], abs=1e-5)


# ---------------------------------------------------------------------------------------------
# What the reward model reads
# ---------------------------------------------------------------------------------------------

def test_rm_messages_layout():
    state = JudgeState("Beacon", "Points out strengths.", "But I almost failed.",
                       [{"speaker": "User", "text": "I passed."}, {"speaker": "Anchor", "text": "Well done."}])
    msgs = reward.rm_messages(state, "You still passed, and you prepared for it.")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant"]
    assert msgs[0]["content"] == "You are Beacon. Points out strengths."
    assert msgs[1]["content"] == "User: I passed.\nAnchor: Well done.\nUser: But I almost failed."
    assert msgs[2]["content"] == "You still passed, and you prepared for it."


def test_last_token_index_left_and_right_padding():
    mask = torch.tensor([[0, 0, 1, 1],     # left padded: last real column 3
                         [1, 1, 0, 0],     # right padded: last real column 1
                         [1, 1, 1, 1]])    # no padding
    assert reward.last_token_index(mask).tolist() == [3, 1, 3]


def test_score_ignores_padding_on_either_side(tiny_rm):
    rm, tok = tiny_rm
    chats = [chat("I lost my keys.", "That is annoying. Where did you last see them?"),
             chat("Hi.", "Hello."),
             chat("My exam went badly and I cannot stop replaying it.", "Replaying it hurts.",
                  history=[{"speaker": "Catalyst", "text": "What happened?"}])]
    with torch.no_grad():
        alone = [rm(*rm.encode(tok, [c])).item() for c in chats]   # one row each: no padding
        ids, mask = rm.encode(tok, chats)                          # left padded (sampler.left_pad)
        assert (mask == 0).any(), "the batch must actually contain padding"
        left = rm(ids, mask).tolist()
        # Right padding: move each row's real tokens to the front.
        right_ids, right_mask = torch.full_like(ids, tok.pad_token_id), torch.zeros_like(mask)
        for i in range(len(chats)):
            real = ids[i][mask[i].bool()]
            right_ids[i, :len(real)], right_mask[i, :len(real)] = real, 1
        right = rm(right_ids, right_mask).tolist()
    assert left == pytest.approx(alone, abs=1e-5)
    assert right == pytest.approx(alone, abs=1e-5)
    assert len({round(s, 4) for s in alone}) == 3, "different chats should get different scores"


def test_encode_truncates_from_the_left(tiny_rm):
    rm, tok = tiny_rm
    c = chat("A long message. " * 30, "The reply at the end.")
    full, _ = rm.encode(tok, [c], max_length=10_000)
    cut, mask = rm.encode(tok, [c], max_length=12)
    assert full.shape[1] > 12 and cut.shape == (1, 12) and mask.sum() == 12
    assert cut[0].tolist() == full[0, -12:].tolist()               # the reply survives
    assert "The reply at the end." in tok.decode(cut[0])


# ---------------------------------------------------------------------------------------------
# The reward model learns a preference
# ---------------------------------------------------------------------------------------------

TOPICS = ["dog", "exam", "job", "sister", "car", "garden", "piano", "rent"]
USER_LINES = ["I keep thinking about my {w} today.", "Something happened with my {w} and I feel odd.",
              "My {w} is on my mind again.", "I need to talk about my {w}."]
REPLIES = ["It sounds like the {w} matters a lot to you.", "Tell me more about the {w}, I am listening.",
           "The {w} seems to weigh on you.", "I am glad you told me about the {w}.",
           "That must be hard, with the {w} and everything.", "What do you feel when you think of the {w}?",
           "You have been carrying the {w} for a while.", "Maybe the {w} can wait until tomorrow."]


def synthetic_pairs(n, seed):
    """Chosen replies open with "Gently now.", rejected ones with "Quickly now." or "Anyway now."
    (the same number of tokens); the rest of each reply is drawn independently from the same
    templates. So the opener is the only reliable signal, and an untrained model, whose scores
    mostly reflect the random rest, sits near chance."""
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        w = rng.choice(TOPICS)
        context = rng.choice(USER_LINES).format(w=w)
        a, b = rng.sample(REPLIES, 2)
        pairs.append({"state_id": f"state-{i}", "chosen_messages": chat(context, "Gently now. " + a.format(w=w)),
                      "rejected_messages": chat(context, rng.choice(["Quickly now. ", "Anyway now. "])
                                                + b.format(w=w))})
    return pairs


def test_reward_model_learns_a_synthetic_preference():
    # Measured on seeds 0, 1, 2: untrained held-out accuracy 0.475 / 0.625 / 0.325, trained 1.0
    # each, so 0.9 leaves a wide margin.
    torch.manual_seed(0)
    rm, tok = reward.RewardModel.from_base("tiny")
    pairs = synthetic_pairs(200, seed=0)
    _, held = reward.split_pairs(pairs, 0.2, seed=0)
    before_loss, before_acc = reward.evaluate_pairs(rm, tok, held)
    lines = []
    metrics = reward.train_reward_model(rm, tok, pairs, held_out_fraction=0.2, epochs=2, lr=3e-4,
                                        batch_size=16, seed=0, log=lines.append)
    assert before_acc < 0.75                                       # starts near chance
    assert metrics["heldout_accuracy"] >= 0.90                     # and learns the preference
    assert metrics["heldout_loss"] < before_loss
    assert metrics["n_train"] == 160 and metrics["n_heldout"] == 40
    assert len(lines) == 3 and lines[-1].startswith("reward model epoch 2/2")   # header + 1 per epoch
    # No gradients left attached after training: they would be one more copy of the weights.
    assert all(p.grad is None for p in rm.parameters())


def test_labelled_hack_accuracy_scores_each_pair_once_and_splits_by_kind(tmp_path):
    torch.manual_seed(0)
    rm, tok = reward.RewardModel.from_base("tiny")
    rows = [json.loads(line) for line in (HERE / "data" / "judge_pairs_hacks.jsonl").read_text().splitlines()[:12]]
    path = tmp_path / "hacks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    calls = []
    rm.head.register_forward_pre_hook(lambda mod, args: calls.append(args[0].shape[0]))
    result = reward.labelled_hack_accuracy(rm, tok, path)
    assert sum(calls) == 2 * len(rows)                             # chosen + rejected, once each
    # Each kind's accuracy is the accuracy on that kind's pairs alone, scored separately.
    for kind, acc in result["per_kind"].items():
        pairs = [{"chosen_messages": reward.rm_messages(JudgeState.from_pair(r), r["better"]),
                  "rejected_messages": reward.rm_messages(JudgeState.from_pair(r), r["worse"])}
                 for r in rows if r["failure"] == kind]
        assert acc == pytest.approx(reward.evaluate_pairs(rm, tok, pairs)[1])
    assert result["n"] == 12


def test_one_pair_at_a_time_is_the_batch_gradient(monkeypatch):
    # train_reward_model runs the pairs of a batch one at a time; the gradient it clips and steps
    # with must be that of the batch-mean Bradley-Terry loss over every chat in one forward.
    pairs = synthetic_pairs(6, seed=2)
    torch.manual_seed(0)
    rm, tok = reward.RewardModel.from_base("tiny")
    manual = copy.deepcopy(rm)
    seen = []
    clip = torch.nn.utils.clip_grad_norm_

    def recording_clip(params, max_norm):
        params = list(params)
        seen.append([p.grad.clone() for p in params])
        return clip(params, max_norm)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recording_clip)
    reward.train_reward_model(rm, tok, pairs, held_out_fraction=0.0, epochs=1, lr=1e-3,
                              batch_size=6, log=lambda line: None)
    ids, mask = manual.encode(tok, [p["chosen_messages"] for p in pairs] + [p["rejected_messages"] for p in pairs])
    scores = manual(ids, mask)                                     # (12,)
    reward.bradley_terry_loss(scores[:6], scores[6:]).backward()
    assert len(seen) == 1                                          # one batch, one step
    for (name, p), grad in zip(manual.named_parameters(), seen[0]):
        assert torch.allclose(grad, p.grad, atol=1e-6), name


def test_score_shared_equals_the_plain_forward_and_runs_the_shared_part_once():
    torch.manual_seed(0)
    rm, tok = reward.RewardModel.from_base("tiny")
    pair = synthetic_pairs(1, seed=4)[0]
    rows = rm.token_rows(tok, [pair["chosen_messages"], pair["rejected_messages"]])
    P = reward.common_prefix(rows)
    assert 10 < P < min(len(r) for r in rows)                      # the conversation is shared
    tokens = []
    rm.backbone.register_forward_pre_hook(lambda mod, args, kwargs: tokens.append(kwargs["input_ids"].numel()),
                                          with_kwargs=True)
    shared = rm.score_shared(rows)                                 # (2,)
    assert sum(tokens) == P + 2 * (max(len(r) for r in rows) - P)  # the shared part once
    plain = rm(*rm.encode(tok, [pair["chosen_messages"], pair["rejected_messages"]]))
    assert torch.allclose(shared, plain, atol=1e-5)
    # Rows of different lengths, one of them the other's prefix plus one token, and rows that
    # share nothing (the plain path): the same scores as forward.
    for rows in ([[5, 6, 7, 8], [5, 6, 7, 8, 9]], [[5, 6, 7], [8, 9]], [[5, 6, 7]]):
        ids, mask = sampler.left_pad(rows, 0)
        assert torch.allclose(rm.score_shared(rows), rm(ids, mask), atol=1e-5), rows
    assert reward.common_prefix([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2 and reward.common_prefix([[1], [2]]) == 0
    # score_texts groups the chats that differ only in the reply (here 3 replies to one
    # conversation, 2 to another, 1 alone) and keeps every score in its row.
    chats = [p["chosen_messages"] for p in synthetic_pairs(3, seed=5)]
    many = [chats[0][:-1] + [{"role": "assistant", "content": r}] for r in ("One.", "Two words.", "Three more.")]
    many = [many[0], chats[1], many[1], chats[2], many[2],
            chats[1][:-1] + [{"role": "assistant", "content": "Another reply."}]]
    one_by_one = [rm(*rm.encode(tok, [m])).item() for m in many]
    assert rm.score_texts(tok, many, batch_size=2) == pytest.approx(one_by_one, abs=1e-5)


def test_training_is_deterministic_and_never_fakes_heldout_accuracy():
    pairs = synthetic_pairs(12, seed=1)
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        rm, tok = reward.RewardModel.from_base("tiny")
        runs.append(reward.train_reward_model(rm, tok, pairs, held_out_fraction=0.25, epochs=1,
                                              lr=3e-4, batch_size=4, seed=3, log=lambda line: None))
    assert runs[0] == runs[1]
    torch.manual_seed(0)
    rm, tok = reward.RewardModel.from_base("tiny")
    metrics = reward.train_reward_model(rm, tok, pairs, held_out_fraction=0.0, epochs=1, lr=3e-4,
                                        batch_size=4, log=lambda line: None)
    assert metrics["n_heldout"] == 0
    assert metrics["heldout_accuracy"] is None and metrics["heldout_loss"] is None


# ---------------------------------------------------------------------------------------------
# Saving and loading
# ---------------------------------------------------------------------------------------------

def test_save_load_round_trip(tiny_rm, tmp_path):
    rm, tok = tiny_rm
    chats = [chat("I got the job!", "That is wonderful news, well done."), chat("Hi.", "Hello.")]
    folder = rm.save(tmp_path / "rm", tok, metrics={"heldout_accuracy": 0.5})
    assert not (tmp_path / "rm.tmp").exists()                      # renamed into place
    loaded, loaded_tok = reward.RewardModel.load(folder)
    assert loaded.score_texts(loaded_tok, chats) == pytest.approx(rm.score_texts(tok, chats), abs=1e-6)
    assert loaded.base_model == "tiny" and loaded_tok.padding_side == "left"
    rm.save(folder, tok)                                           # overwriting a reward model is fine


def test_load_or_overwrite_a_wrong_folder_is_a_user_error(tiny_rm, tmp_path):
    rm, tok = tiny_rm
    not_rm = tmp_path / "speaker-checkpoint"
    not_rm.mkdir()
    (not_rm / "config.json").write_text("{}")
    with pytest.raises(data.UserError, match="speaker-checkpoint"):
        reward.RewardModel.load(not_rm)
    with pytest.raises(data.UserError, match="nowhere"):
        reward.RewardModel.load(tmp_path / "nowhere")
    with pytest.raises(data.UserError, match="not a reward model"):
        rm.save(not_rm, tok)                                       # would delete someone's folder
    assert (not_rm / "config.json").exists()


# ---------------------------------------------------------------------------------------------
# Format reward
# ---------------------------------------------------------------------------------------------

OTHERS = ["Catalyst", "Beacon", "Guide"]


def test_format_reward_perfect_reply():
    value, parts = reward.format_reward("I hear you. That sounds exhausting.", "Anchor", OTHERS, True)
    assert value == 1.0 and set(parts.values()) == {1.0}


def test_format_reward_survives_a_lone_emoji_variation_selector():
    value, parts = reward.format_reward("\ufe0f", "Anchor", OTHERS, True)
    assert parts["finished_sentence"] == 0.0 and parts["length"] == 0.0 and 0.0 <= value <= 1.0


def test_format_reward_length():
    assert reward.format_reward("Okay.", "Anchor", OTHERS, True)[1]["length"] == 0.0        # 1 word
    assert reward.format_reward("Yes, I hear you.", "Anchor", OTHERS, True)[1]["length"] == 1.0  # 4 words
    long = "word " * 60 + "end."                                                            # 61 words
    value, parts = reward.format_reward(long, "Anchor", OTHERS, True)
    assert parts["length"] == 0.0 and value == 0.75


def test_format_reward_label_prefix():
    for text in ("Anchor: I hear you, truly.", "**Anchor**: I hear you, truly.",
                 "anchor - I hear you, truly.", "Catalyst: what makes you say that?"):
        assert reward.format_reward(text, "Anchor", OTHERS, True)[1]["no_label_prefix"] == 0.0, text
    # A name inside a word or a sentence is not a label.
    for text in ("I hear you, and Anchor is here.", "User-friendly advice is rare, sadly."):
        assert reward.format_reward(text, "Anchor", OTHERS, True)[1]["no_label_prefix"] == 1.0, text


def test_format_reward_speaking_for_others():
    for text in ("I hear you. User: thanks, that helps.", "That is hard.\nBeacon: you did well though!",
                 "User: I feel better now, thanks."):
        assert reward.format_reward(text, "Anchor", OTHERS, True)[1]["no_other_speakers"] == 0.0, text
    # Its own label is a prefix problem, not someone else's line; a name in prose is fine.
    value, parts = reward.format_reward("Anchor: I hear you. Beacon mentioned it too.", "Anchor", OTHERS, True)
    assert parts == {"length": 1.0, "no_label_prefix": 0.0, "no_other_speakers": 1.0, "finished_sentence": 1.0}
    assert value == 0.75


def test_format_reward_finished_sentence():
    def finished(text, stopped=True):
        return reward.format_reward(text, "Anchor", OTHERS, stopped)[1]["finished_sentence"]
    assert finished("That sounds really hard to carry.") == 1.0
    assert finished("Would you like to talk about it?") == 1.0
    assert finished('You said "I am done."') == 1.0
    assert finished("I am proud of you 😊") == 1.0
    assert finished("I am proud of you ❤️") == 1.0                 # emoji + variation selector
    assert finished("That sounds really hard to carry and") == 0.0
    assert finished("That sounds really hard to carry.", stopped=False) == 0.0  # hit the token limit


def test_format_reward_empty_reply_scores_zero():
    value, parts = reward.format_reward("   ", "Anchor", OTHERS, True)
    assert value == 0.0 and set(parts.values()) == {0.0}


# ---------------------------------------------------------------------------------------------
# Reward hacks: the pairs that teach the reward model to reject them, and best-of-N grading
# ---------------------------------------------------------------------------------------------

def diag(copy=0.0, words=10.0):
    return {"context_copy": copy, "persona_copy": 0.0, "history_echo": 0.0, "self_repeat": 0.0, "meta_leak": 0.0,
            "trivial": 0.0, "words": words}


def test_grade_picks_hand_computed():
    # 4 states x 2 candidates: candidate 0 copies the context, candidate 1 does not.
    diags = [diag(1.0), diag(0.0)] * 4
    copier = judge_eval.grade_picks(diags, 2, [0, 0, 0, 0])
    # pick rate 1.0, chance 0.5 in every state: difference +0.5 with se 0 -> fails
    assert copier["rates"]["context_copy"] == 1.0
    assert copier["difference"]["context_copy"] == (0.5, 0.0) and not copier["passes"]
    avoider = judge_eval.grade_picks(diags, 2, [1, 1, 1, 1])
    assert avoider["difference"]["context_copy"] == (-0.5, 0.0) and avoider["passes"]
    # Half and half: differences +0.5, -0.5, +0.5, -0.5: mean 0 -> passes.
    assert judge_eval.grade_picks(diags, 2, [0, 1, 0, 1])["passes"]
    # Longer picks are reported but do not fail a grader.
    longer = judge_eval.grade_picks([diag(0.0, 2.0), diag(0.0, 20.0)] * 4, 2, [1, 1, 1, 1])
    assert longer["difference"]["words"] == (9.0, 0.0) and longer["passes"]


def test_grade_independent_hand_computed():
    # 2 states x 3 candidates; the independent evaluator's numbers per candidate.
    def g(correct, ratio, equal=None):
        return {"correct": correct, "log_ratio": ratio, "correct_equal": equal, "tokens": 5}
    scores = [g(1.0, 0.3, 1.0), g(0.0, 0.0), g(0.0, -0.3, 0.0),            # state 0: chance 1/3, ratio 0.0
              g(1.0, 0.2, 0.0), g(1.0, 0.1, 1.0), g(0.0, 0.0, 1.0)]      # state 1: chance 2/3, ratio 0.1
    best = judge_eval.grade_independent(scores, 3, [0, 0])
    # picks: correct 1, 1 -> mean 1.0; differences 1 - 1/3 and 1 - 2/3 -> mean 0.5
    assert best["correct"][0] == 1.0 and best["correct"][1] == pytest.approx(0.5)
    # log-ratio differences 0.3 and 0.1: mean 0.2, se = std([0.3, 0.1]) / sqrt(2) = 0.1
    assert best["log_ratio"][1] == pytest.approx(0.2) and best["log_ratio"][2] == pytest.approx(0.1)
    # equal length: state 0's short candidate has None and is left out of chance (1/2); picks 1, 0;
    # differences 1 - 1/2 and 0 - 2/3 -> mean -1/12
    assert best["correct_equal"][0] == 0.5 and best["correct_equal"][1] == pytest.approx(-1 / 12)
    worst = judge_eval.grade_independent(scores, 3, [2, 2])
    assert worst["correct"][1] == pytest.approx(-0.5) and worst["log_ratio"][1] == pytest.approx(-0.2)
    # A pick whose speaker the evaluator cannot score is skipped, and its state's None candidates
    # do not enter the chance rate.
    scores[1] = g(None, None)
    skipped = judge_eval.grade_independent(scores, 3, [1, 0])
    assert skipped["correct"] == (1.0, pytest.approx(1 / 3), 0.0)
    assert judge_eval.grade_independent(scores[:3], 3, [1])["correct"] == (None, None, None)


def test_within_state_correlation_and_feature_alignment_by_hand():
    # 2 states x 2 candidates. Within-state deviations: x (0.5, -0.5), (1, -1); y (0.2, -0.2),
    # (0.1, -0.1): sum xy 0.4, sum xx 2.5, sum yy 0.1 -> r = 0.4 / sqrt(0.25) = 0.8. The states'
    # own levels (x around 0.5 and 4) do not enter.
    xs, ys = [1.0, 0.0, 5.0, 3.0], [0.5, 0.1, 0.4, 0.2]
    assert judge_eval.within_state_correlation(xs, ys, 2) == pytest.approx(0.8)
    assert judge_eval.within_state_correlation([-x for x in xs], ys, 2) == pytest.approx(-0.8)
    # A candidate without a score leaves its state with one: that state drops out (r of 1 pair = 1).
    assert judge_eval.within_state_correlation(xs, [0.5, None, 0.4, 0.2], 2) == pytest.approx(1.0)
    assert judge_eval.within_state_correlation([1.0, 1.0, 2.0, 2.0], ys, 2) is None      # x never varies
    gold = [{"correct": None, "log_ratio": y, "correct_equal": None} for y in ys]
    feats = [{"a": x, "b": -x} for x in xs]
    align = judge_eval.feature_alignment(feats, gold, 2)
    # a picks candidate 0 of each state: log-ratios 0.5 and 0.4 against chance 0.3 and 0.3:
    # differences 0.2 and 0.1 -> mean 0.15, se = std(0.2, 0.1) / sqrt(2) = 0.05
    assert align["a"]["r"] == pytest.approx(0.8)
    assert align["a"]["pick"] == (pytest.approx(0.45), pytest.approx(0.15), pytest.approx(0.05))
    assert align["b"]["r"] == pytest.approx(-0.8) and align["b"]["pick"][1] == pytest.approx(-0.15)


def test_split_pairs_keeps_every_state_on_one_side():
    pairs = [{"state_id": f"s{i % 10}", "k": i} for i in range(40)]       # 4 pairs per state
    train, held = reward.split_pairs(pairs, 0.3, seed=0)
    assert len(held) == 3 * 4 and len(train) == 7 * 4
    assert not {p["state_id"] for p in train} & {p["state_id"] for p in held}
    assert reward.split_pairs(pairs, 0.3, seed=0) == (train, held)
