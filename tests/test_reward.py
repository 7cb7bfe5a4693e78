"""Tests for reward.py: the Bradley-Terry loss by hand, the reward model on the tiny random Llama
(padding, truncation, learning a synthetic preference, save/load), and the format reward."""

import copy
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import reward
from plumbing import common
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
    torch.manual_seed(0)  # the head's random init
    return reward.RewardModel.from_base("tiny")


def chat(context, reply, history=()):
    return reward.rm_messages(
        JudgeState("Anchor", "A calm listener who validates feelings.", context, list(history)),
        reply,
    )


# ---------------------------------------------------------------------------------------------
# Bradley-Terry loss
# ---------------------------------------------------------------------------------------------


def test_bt_loss_is_log2_for_equal_rewards():
    for value in (-3.0, 0.0, 0.7, 12.0):
        r = torch.full((5,), value)
        assert reward.bradley_terry_loss(r, r.clone()).item() == pytest.approx(
            math.log(2), abs=1e-6
        )


def test_bt_loss_hand_computed():
    # margins r_c - r_r = [2 - 0, 0 - 1] = [2, -1]
    # -log sigmoid(2)  = log(1 + e^-2) = log(1.135335) = 0.126928
    # -log sigmoid(-1) = log(1 + e^1)  = log(3.718282) = 1.313262
    # mean = (0.126928 + 1.313262) / 2 = 0.720095
    r_c = torch.tensor([2.0, 0.0])
    r_r = torch.tensor([0.0, 1.0])
    assert reward.bradley_terry_loss(r_c, r_r).item() == pytest.approx(0.720095, abs=1e-5)
    # Far from zero the loss stays finite and exact: -log sigmoid(-100) = 100 (naive log(sigmoid) = inf).
    assert reward.bradley_terry_loss(
        torch.tensor([0.0]), torch.tensor([100.0])
    ).item() == pytest.approx(100.0)


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
    state = JudgeState(
        "Beacon",
        "Points out strengths.",
        "But I almost failed.",
        [{"speaker": "User", "text": "I passed."}, {"speaker": "Anchor", "text": "Well done."}],
    )
    msgs = reward.rm_messages(state, "You still passed, and you prepared for it.")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant"]
    assert msgs[0]["content"] == "You are Beacon. Points out strengths."
    assert msgs[1]["content"] == "User: I passed.\nAnchor: Well done.\nUser: But I almost failed."
    assert msgs[2]["content"] == "You still passed, and you prepared for it."


def test_hf_pools_the_last_real_token_of_our_chats(tiny_rm):
    # SmolLM2's pad id is <|im_end|>, which closes every turn; HF's classifier pools the rightmost
    # token that is not the pad id. Our rendered chats end with "<|im_end|>\n", so that token is
    # the last real one, in left-padded batches too.
    rm, tok = tiny_rm
    ids, mask = rm.encode(
        tok, [chat("I got the job!", "Well done."), chat("Hi.", "Hello there, how are you?")]
    )
    assert (ids[:, -1] != tok.pad_token_id).all() and (ids[:, -2] == tok.pad_token_id).all()
    non_pad = (torch.arange(ids.shape[1]) * (ids != tok.pad_token_id)).argmax(1)
    last_real = (torch.arange(ids.shape[1]) * mask).argmax(1)
    assert non_pad.tolist() == last_real.tolist() == [ids.shape[1] - 1] * 2


def test_score_ignores_padding_on_either_side(tiny_rm):
    rm, tok = tiny_rm
    chats = [
        chat("I lost my keys.", "That is annoying. Where did you last see them?"),
        chat("Hi.", "Hello."),
        chat(
            "My exam went badly and I cannot stop replaying it.",
            "Replaying it hurts.",
            history=[{"speaker": "Catalyst", "text": "What happened?"}],
        ),
    ]
    with torch.no_grad():
        alone = [rm(*rm.encode(tok, [c])).item() for c in chats]  # one row each: no padding
        ids, mask = rm.encode(tok, chats)  # left padded (models.left_pad)
        assert (mask == 0).any(), "the batch must actually contain padding"
        left = rm(ids, mask).tolist()
        # Right padding: move each row's real tokens to the front.
        right_ids, right_mask = torch.full_like(ids, tok.pad_token_id), torch.zeros_like(mask)
        for i in range(len(chats)):
            real = ids[i][mask[i].bool()]
            right_ids[i, : len(real)], right_mask[i, : len(real)] = real, 1
        right = rm(right_ids, right_mask).tolist()
    assert left == pytest.approx(alone, abs=1e-5)
    assert right == pytest.approx(alone, abs=1e-5)
    assert len({round(s, 4) for s in alone}) == 3, "different chats should get different scores"


def test_encode_truncates_from_the_left(tiny_rm):
    rm, tok = tiny_rm
    c = chat("A long message. " * 30, "The reply at the end.")
    keep = rm.max_length
    rm.max_length = 10_000
    full, _ = rm.encode(tok, [c])
    rm.max_length = 12
    cut, mask = rm.encode(tok, [c])
    rm.max_length = keep
    assert full.shape[1] > 12 and cut.shape == (1, 12) and mask.sum() == 12
    assert cut[0].tolist() == full[0, -12:].tolist()  # the reply survives
    assert "The reply at the end." in tok.decode(cut[0])


# ---------------------------------------------------------------------------------------------
# The reward model learns a preference
# ---------------------------------------------------------------------------------------------

TOPICS = ["dog", "exam", "job", "sister", "car", "garden", "piano", "rent"]
USER_LINES = [
    "I keep thinking about my {w} today.",
    "Something happened with my {w} and I feel odd.",
    "My {w} is on my mind again.",
    "I need to talk about my {w}.",
]
REPLIES = [
    "It sounds like the {w} matters a lot to you.",
    "Tell me more about the {w}, I am listening.",
    "The {w} seems to weigh on you.",
    "I am glad you told me about the {w}.",
    "That must be hard, with the {w} and everything.",
    "What do you feel when you think of the {w}?",
    "You have been carrying the {w} for a while.",
    "Maybe the {w} can wait until tomorrow.",
]


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
        pairs.append(
            {
                "state_id": f"state-{i}",
                "chosen_messages": chat(context, "Gently now. " + a.format(w=w)),
                "rejected_messages": chat(
                    context, rng.choice(["Quickly now. ", "Anyway now. "]) + b.format(w=w)
                ),
            }
        )
    return pairs


def test_reward_model_learns_a_synthetic_preference(capsys):
    # Measured on seeds 0, 1, 2: untrained held-out accuracy 0.475 / 0.625 / 0.325, trained 1.0
    # each, so 0.9 leaves a wide margin.
    torch.manual_seed(0)
    rm, tok = reward.RewardModel.from_base("tiny")
    pairs = synthetic_pairs(200, seed=0)
    _, held = reward.split_pairs(pairs, 0.2, seed=0)
    before_loss, before_acc = reward.evaluate_pairs(rm, tok, held)
    capsys.readouterr()
    metrics = reward.train_reward_model(
        rm, tok, pairs, held_out=0.2, epochs=2, lr=3e-4, batch_size=16, seed=0
    )
    lines = capsys.readouterr().out.splitlines()
    assert before_acc < 0.75  # starts near chance
    assert metrics["heldout_accuracy"] >= 0.90  # and learns the preference
    assert metrics["heldout_loss"] < before_loss
    assert metrics["n_train"] == 160 and metrics["n_heldout"] == 40
    assert len(lines) == 3 and lines[-1].startswith(
        "reward model epoch 2/2"
    )  # header + 1 per epoch
    # No gradients left attached after training: they would be one more copy of the weights.
    assert all(p.grad is None for p in rm.parameters())


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
    reward.train_reward_model(rm, tok, pairs, held_out=0.0, epochs=1, lr=1e-3, batch_size=6)
    ids, mask = manual.encode(
        tok, [p["chosen_messages"] for p in pairs] + [p["rejected_messages"] for p in pairs]
    )
    scores = manual(ids, mask)  # (12,)
    reward.bradley_terry_loss(scores[:6], scores[6:]).backward()
    assert len(seen) == 1  # one batch, one step
    # Equal up to fp32 summation order only: one forward of 12 chats and six of 2 sum each gradient
    # element over the same ~1,000 token terms in another order (other matmul shapes, other kernels:
    # an AVX-512 CPU gave 1.9e-6 absolute where AVX2 gave 0). A sum of n fp32 terms can move by
    # about n * 2^-24 of their magnitude (~6e-5 for n ~ 1,000), so the bound is 1e-4 of the
    # tensor's largest gradient; a wrong accumulation (a missing 1/n, a pair counted twice) is off
    # by a factor, far outside it.
    for (name, p), grad in zip(manual.named_parameters(), seen[0]):
        assert (grad - p.grad).abs().max() <= 1e-4 * p.grad.abs().max() + 1e-10, name


def test_score_texts_keeps_every_score_in_its_row():
    # score_texts batches the chats (here 2 at a time); every score is the one the chat gets alone.
    torch.manual_seed(0)
    rm, tok = reward.RewardModel.from_base("tiny")
    chats = [p["chosen_messages"] for p in synthetic_pairs(3, seed=5)]
    many = [
        chats[0][:-1] + [{"role": "assistant", "content": r}]
        for r in ("One.", "Two words.", "Three more.")
    ]
    many = [
        many[0],
        chats[1],
        many[1],
        chats[2],
        many[2],
        chats[1][:-1] + [{"role": "assistant", "content": "Another reply."}],
    ]
    one_by_one = [rm(*rm.encode(tok, [m])).item() for m in many]
    assert rm.score_texts(tok, many, batch_size=2) == pytest.approx(one_by_one, abs=1e-5)


def test_training_is_deterministic_and_never_fakes_heldout_accuracy():
    pairs = synthetic_pairs(12, seed=1)
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        rm, tok = reward.RewardModel.from_base("tiny")
        runs.append(
            reward.train_reward_model(
                rm,
                tok,
                pairs,
                held_out=0.25,
                epochs=1,
                lr=3e-4,
                batch_size=4,
                seed=3,
            )
        )
    assert runs[0] == runs[1]
    torch.manual_seed(0)
    rm, tok = reward.RewardModel.from_base("tiny")
    metrics = reward.train_reward_model(
        rm, tok, pairs, held_out=0.0, epochs=1, lr=3e-4, batch_size=4
    )
    assert metrics["n_heldout"] == 0
    assert metrics["heldout_accuracy"] is None and metrics["heldout_loss"] is None


# ---------------------------------------------------------------------------------------------
# Saving and loading
# ---------------------------------------------------------------------------------------------


def test_save_load_round_trip(tiny_rm, tmp_path):
    rm, tok = tiny_rm
    chats = [chat("I got the job!", "That is wonderful news, well done."), chat("Hi.", "Hello.")]
    folder = rm.save(tmp_path / "rm", tok, metrics={"heldout_accuracy": 0.5})
    assert not (tmp_path / "rm.tmp").exists()  # renamed into place
    loaded, loaded_tok = reward.RewardModel.load(folder)
    assert loaded.score_texts(loaded_tok, chats) == pytest.approx(
        rm.score_texts(tok, chats), abs=1e-6
    )
    assert loaded.base_model == "tiny" and loaded_tok.padding_side == "left"
    assert loaded.metrics == {"heldout_accuracy": 0.5}
    rm.save(folder, tok)  # overwriting a reward model is fine


def test_saved_reward_model_loads_with_hf_classes_in_a_fresh_python(tiny_rm, tmp_path):
    # A TRL user's path: AutoModelForSequenceClassification and pipeline, in a process that never
    # imported mascot, give the scores our own class gives (one chat at a time: no padding).
    rm, tok = tiny_rm
    chats = [chat("I got the job!", "That is wonderful news, well done."), chat("Hi.", "Hello.")]
    folder = rm.save(tmp_path / "rm", tok)
    texts = [tok.apply_chat_template(c, tokenize=False) for c in chats]
    script = """
import json, sys, torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline
folder, texts = sys.argv[1], json.loads(sys.argv[2])
model = AutoModelForSequenceClassification.from_pretrained(folder)
tok = AutoTokenizer.from_pretrained(folder)
with torch.no_grad():
    direct = [model(**tok(t, return_tensors="pt")).logits[0, 0].item() for t in texts]
pipe = pipeline("text-classification", model=folder, function_to_apply="none")
print(json.dumps({"direct": direct, "pipeline": [r["score"] for r in pipe(texts)], "labels": model.config.num_labels,
                  "arch": model.config.architectures}))
"""
    out = subprocess.run(
        [sys.executable, "-c", script, str(folder), json.dumps(texts)],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    ours = rm.score_texts(tok, chats)
    assert got["labels"] == 1 and got["arch"] == ["LlamaForSequenceClassification"]
    assert got["direct"] == pytest.approx(ours, abs=1e-4) and got["pipeline"] == pytest.approx(
        ours, abs=1e-4
    )


def test_a_first_format_reward_model_folder_says_how_to_convert(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    (old / "reward_config.json").write_text(
        json.dumps({"format": "mascot-reward-model", "base_model": "tiny"})
    )
    with pytest.raises(common.UserError, match="first format.*--resume.*pairs.jsonl"):
        reward.RewardModel.load(old)


def test_load_or_overwrite_a_wrong_folder_is_a_user_error(tiny_rm, tmp_path):
    rm, tok = tiny_rm
    not_rm = tmp_path / "speaker-checkpoint"
    not_rm.mkdir()
    (not_rm / "config.json").write_text("{}")
    with pytest.raises(common.UserError, match="speaker-checkpoint"):
        reward.RewardModel.load(not_rm)
    with pytest.raises(common.UserError, match="nowhere"):
        reward.RewardModel.load(tmp_path / "nowhere")
    with pytest.raises(common.UserError, match="not a reward model"):
        rm.save(not_rm, tok)  # would delete someone's folder
    assert (not_rm / "config.json").exists()


# ---------------------------------------------------------------------------------------------
# Format reward
# ---------------------------------------------------------------------------------------------

OTHERS = ["Catalyst", "Beacon", "Guide"]


def test_format_reward_perfect_reply():
    value, parts = reward.format_reward(
        "I hear you. That sounds exhausting.", "Anchor", OTHERS, True
    )
    assert value == 1.0 and set(parts.values()) == {1.0}


def test_format_reward_survives_a_lone_emoji_variation_selector():
    value, parts = reward.format_reward("\ufe0f", "Anchor", OTHERS, True)
    assert parts["finished_sentence"] == 0.0 and parts["length"] == 0.0 and 0.0 <= value <= 1.0


def test_format_reward_length():
    assert reward.format_reward("Okay.", "Anchor", OTHERS, True)[1]["length"] == 0.0  # 1 word
    assert (
        reward.format_reward("Yes, I hear you.", "Anchor", OTHERS, True)[1]["length"] == 1.0
    )  # 4 words
    long = "word " * 60 + "end."  # 61 words
    value, parts = reward.format_reward(long, "Anchor", OTHERS, True)
    assert parts["length"] == 0.0 and value == 0.75


def test_format_reward_label_prefix():
    for text in (
        "Anchor: I hear you, truly.",
        "**Anchor**: I hear you, truly.",
        "anchor - I hear you, truly.",
        "Catalyst: what makes you say that?",
        "(Supporter, another companion): I hear you, truly.",
    ):  # the prompt's label for the others
        assert reward.format_reward(text, "Anchor", OTHERS, True)[1]["no_label_prefix"] == 0.0, text
    # A name inside a word or a sentence is not a label.
    for text in ("I hear you, and Anchor is here.", "User-friendly advice is rare, sadly."):
        assert reward.format_reward(text, "Anchor", OTHERS, True)[1]["no_label_prefix"] == 1.0, text


def test_format_reward_speaking_for_others():
    for text in (
        "I hear you. User: thanks, that helps.",
        "That is hard.\nBeacon: you did well though!",
        "User: I feel better now, thanks.",
        "That is hard. (Supporter, another companion): it is.",
    ):
        assert reward.format_reward(text, "Anchor", OTHERS, True)[1]["no_other_speakers"] == 0.0, (
            text
        )
    # Its own label is a prefix problem, not someone else's line; a name in prose is fine.
    value, parts = reward.format_reward(
        "Anchor: I hear you. Beacon mentioned it too.", "Anchor", OTHERS, True
    )
    assert parts == {
        "length": 1.0,
        "no_label_prefix": 0.0,
        "no_other_speakers": 1.0,
        "finished_sentence": 1.0,
    }
    assert value == 0.75


def test_format_reward_finished_sentence():
    def finished(text, stopped=True):
        return reward.format_reward(text, "Anchor", OTHERS, stopped)[1]["finished_sentence"]

    assert finished("That sounds really hard to carry.") == 1.0
    assert finished("Would you like to talk about it?") == 1.0
    assert finished('You said "I am done."') == 1.0
    assert finished("I am proud of you 😊") == 1.0
    assert finished("I am proud of you ❤️") == 1.0  # emoji + variation selector
    assert finished("That sounds really hard to carry and") == 0.0
    assert (
        finished("That sounds really hard to carry.", stopped=False) == 0.0
    )  # hit the token limit


def test_format_reward_empty_reply_scores_zero():
    value, parts = reward.format_reward("   ", "Anchor", OTHERS, True)
    assert value == 0.0 and set(parts.values()) == {0.0}


# ---------------------------------------------------------------------------------------------
# Reward hacks: the pairs that teach the reward model to reject them, and best-of-N grading
# ---------------------------------------------------------------------------------------------


def test_split_pairs_keeps_every_state_on_one_side():
    pairs = [{"state_id": f"s{i % 10}", "k": i} for i in range(40)]  # 4 pairs per state
    train, held = reward.split_pairs(pairs, 0.3, seed=0)
    assert len(held) == 3 * 4 and len(train) == 7 * 4
    assert not {p["state_id"] for p in train} & {p["state_id"] for p in held}
    assert reward.split_pairs(pairs, 0.3, seed=0) == (train, held)
