"""bench/reward_model_speed.py: a reward-model training step with and without the shared conversation.

A preference pair is two replies to one conversation, so its two chats share their first ~300
tokens (persona and history) and differ in the last ~40 (the reply). Stage 1's reward model
trains one pair at a time (reward.train_reward_model); this times that pair's forward + backward
on the embedded SmolLM2-135M two ways, interleaved so a change of machine load hits both alike:

  plain    RewardModel.forward on the two left-padded chats: the conversation runs twice;
  shared   RewardModel.score_shared: the conversation runs once, each reply against its cache.

and, without gradient, the scoring of one state's G = 4 replies (GRPO's reward; score_texts).
The chats are built as stage 1 builds them (reward.build_states, State.rm_messages) from
`--data` (default: the bundled contexts, whose states are openings with short histories; an ESConv
file gives later turns with longer ones), with persona example lines as replies. It prints the
median seconds per call and the ratios.

Run from the repo root (~2 minutes on the 2-core CPU):
    python bench/reward_model_speed.py
    python bench/reward_model_speed.py --data path/to/esconv/train.jsonl --pairs 8 --threads 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

import corpora  # noqa: E402
import data  # noqa: E402
import reward  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=6, help="pairs timed (each one call per way)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--data", default="bundled", help="contexts, as train --data takes them")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    personas = data.load_personas(ROOT / "personas.json", "support")
    contexts = corpora.load_contexts(args.data, persona_set="support")
    states = reward.build_states(contexts, personas, args.pairs, seed=0, generated={}, split="heldout")
    torch.manual_seed(0)
    rm, tok = reward.RewardModel.from_base()
    chats = []
    for i, s in enumerate(states):
        lines = [e for p in personas.personas for e in p.examples]
        chats.append([s.rm_messages(personas, lines[(i + k) % len(lines)]) for k in range(4)])

    def step(messages, shared: bool) -> float:
        t = time.perf_counter()
        if shared:
            r = rm.score_shared(rm.token_rows(tok, messages))
        else:
            r = rm(*rm.encode(tok, messages))
        reward.bradley_terry_loss(r[:1], r[1:2]).backward()
        rm.zero_grad(set_to_none=True)
        return time.perf_counter() - t

    times = {"plain": [], "shared": [], "score plain": [], "score shared": []}
    tokens = []
    for i, four in enumerate(chats):
        rows = rm.token_rows(tok, four[:2])
        tokens.append((reward.common_prefix(rows), [len(r) for r in rows]))
        order = ("plain", "shared") if i % 2 == 0 else ("shared", "plain")
        for way in order:
            times[way].append(step(four[:2], way == "shared"))
        with torch.no_grad():
            t = time.perf_counter()
            ids, mask = rm.encode(tok, four)
            rm(ids, mask)
            times["score plain"].append(time.perf_counter() - t)
            t = time.perf_counter()
            rm.score_texts(tok, four)
            times["score shared"].append(time.perf_counter() - t)
    print(f"load average: {os.getloadavg()[0]:.2f}; threads {torch.get_num_threads()}")
    print("pair tokens (shared, chosen, rejected): " + ", ".join(f"{p}/{a}/{b}" for p, (a, b) in tokens))
    for way, ts in times.items():
        print(f"{way:>13}: median {statistics.median(ts):.3f} s over {len(ts)} calls")
    print(f"pair forward+backward plain/shared: {statistics.median(times['plain']) / statistics.median(times['shared']):.2f}x")
    print(f"4 replies of one state, scoring plain/shared: "
          f"{statistics.median(times['score plain']) / statistics.median(times['score shared']):.2f}x")


if __name__ == "__main__":
    main()
