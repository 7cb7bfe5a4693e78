"""End to end against a real llama.cpp server (llama-cpp-python) serving the embedded SmolLM2 GGUF.

The server runs in its own virtual environment (`make llama`: llama-cpp-python[server] built
from source with CMAKE_ARGS="-DGGML_NATIVE=OFF"); the project never imports it. Give its python
in MASCOT_LLAMA_PYTHON (default .venv-llama/bin/python). Where it is missing the tests are
skipped, unless MASCOT_REQUIRE_LLAMA=1 (CI sets it: .ci/run builds it first).

What runs through the server: judge-eval with an openai: judge, a stage-1 run whose judge is the
server (SmolLM2-135M cannot judge, so it ends, as it should, with the one-line error that names
the judge), and an evaluate whose trained speakers and simulated user are served.
"""

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from plumbing import loading

ROOT = Path(__file__).resolve().parents[1]
LLAMA_PYTHON = Path(os.environ.get("MASCOT_LLAMA_PYTHON", ROOT / ".venv-llama" / "bin" / "python"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    """A llama.cpp server on the embedded GGUF file; yields its base URL."""
    if not LLAMA_PYTHON.exists():
        if os.environ.get("MASCOT_REQUIRE_LLAMA") == "1":
            pytest.fail(f"MASCOT_REQUIRE_LLAMA=1 but {LLAMA_PYTHON} is missing (make llama)")
        pytest.skip(f"no llama.cpp server: {LLAMA_PYTHON} is missing (make llama)")
    gguf = loading.package_folder(loading.GGUF_PACKAGE) / loading.GGUF_FILE
    port = free_port()
    log = (
        open(ROOT / ".cache" / "llama_server.log", "w")
        if (ROOT / ".cache").is_dir()
        else subprocess.DEVNULL
    )
    proc = subprocess.Popen(
        [
            str(LLAMA_PYTHON),
            "-m",
            "llama_cpp.server",
            "--model",
            str(gguf),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            "2048",
            "--n_threads",
            "1",
            "--model_alias",
            "smollm2",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        for _ in range(240):
            if proc.poll() is not None:
                pytest.fail(f"the llama.cpp server exited with {proc.returncode}")
            try:
                with urllib.request.urlopen(url + "/models", timeout=2):
                    break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("the llama.cpp server did not answer within 120 s")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def mascot(*args, expect=0):
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, str(ROOT / "mascot.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        cwd=ROOT,
    )
    assert out.returncode == expect, out.stdout[-2000:] + out.stderr[-2000:]
    return out


def test_judge_eval_stage_1_and_evaluate_through_a_llama_cpp_server(server, tmp_path):
    judge = ["--judge", f"openai:{server}", "--judge-model", "smollm2"]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        "".join((ROOT / "data" / "judge_pairs_blind.jsonl").read_text().splitlines(True)[:4])
    )
    text = mascot(
        "judge-eval", "--pairs", str(pairs), *judge, "--cache", str(tmp_path / "judge.jsonl")
    ).stdout
    assert "accuracy:" in text and "(4 pairs," in text
    answered = len((tmp_path / "judge.jsonl").read_text().splitlines())
    mascot("judge-eval", "--pairs", str(pairs), *judge, "--cache", str(tmp_path / "judge.jsonl"))
    assert (
        len((tmp_path / "judge.jsonl").read_text().splitlines()) == answered
    )  # all from the cache

    # Stage 1 with SmolLM2-135M as its judge: it often rates a reply "Your response is 5 stars.", but
    # as often answers a numbered list ("1. 3\n2. 5"), which is unreadable, and picks "A" in every
    # comparison, so there is no verdict and stage 1 stops before the reward model, naming the judge
    # (a 135M model cannot judge; a served 7B one can). Which replies it can read depends on the
    # sampled candidates (they differ between CPUs), so the test counts: the cache holds exactly the
    # readable scores and the verdict-less but readable comparisons, and a re-run adds nothing.
    run = str(tmp_path / "run")
    stage1 = [
        "train",
        "--stage",
        "1",
        "--model",
        "smollm2-135m",
        "--run",
        run,
        *judge,
        "--states",
        "2",
        "--heldout-states",
        "1",
        "--candidates",
        "3",
        "--max-new-tokens",
        "16",
    ]
    out = mascot(*stage1, expect=2)
    counts = re.search(
        rf"judge openai:{re.escape(server)}:smollm2: (\d+) of 6 scores unreadable; "
        r"(\d+) of (\d+) comparisons without a verdict \((\d+) unreadable\)",
        out.stdout,
    )
    assert counts, out.stdout
    unreadable, _, compared, unreadable_verdicts = map(int, counts.groups())
    assert (
        "error: stage 1: the judge" in out.stderr and "confirmed no preference pair" in out.stderr
    )
    cache = tmp_path / "run" / "stage1" / "judge_cache.jsonl"
    scores = cache.read_text().splitlines() if cache.exists() else []
    assert len(scores) == (6 - unreadable) + (
        compared - unreadable_verdicts
    )  # readable answers only
    again = mascot(*stage1, expect=2)  # the same questions: cached ones not asked
    assert (cache.read_text().splitlines() if cache.exists() else []) == scores
    assert "confirmed no preference pair" in again.stderr

    served = [
        "--speakers",
        f"openai:{server}",
        "--speakers-model",
        "smollm2",
        "--user",
        f"openai:{server}",
        "--user-model",
        "smollm2",
    ]
    mascot(
        "evaluate",
        "--model",
        "tiny",
        "--run",
        run,
        "--systems",
        "mascot-c",
        "--contexts",
        "2",
        "--turns",
        "2",
        "--max-new-tokens",
        "24",
        "--no-persona-id",
        *served,
    )
    rows = [
        json.loads(x)
        for x in (tmp_path / "run" / "eval" / "transcripts.jsonl").read_text().splitlines()
    ]
    replies = [t["text"] for r in rows for t in r["turns"] if t["directive"]]
    assert len(replies) == 4 and all(
        len(t.split()) >= 2 for t in replies
    )  # real words from SmolLM2
    assert (tmp_path / "run" / "eval" / "served_cache.jsonl").stat().st_size > 0
