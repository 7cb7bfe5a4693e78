"""The command line, run as a real subprocess: help, one-line errors, and stages 1-2 end to end
on the tiny model (a plumbing test: the tiny model is random, so no learning is claimed here)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import grpo
import mascot as cli
import reward
from evaluate import all_metrics
from plumbing import runs

ROOT = Path(__file__).resolve().parents[1]


def mascot(*args, timeout=900):
    """`python mascot.py ARGS` in a fresh process, as a user runs it (each call pays ~8 s of imports)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, str(ROOT / "mascot.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=ROOT,
    )


def mascot_here(capsys, monkeypatch, *args) -> tuple[int, str]:
    """The same through mascot.main in this process: (exit status, stderr). What the process would
    exit with is main's return value or argparse's SystemExit; an uncaught exception fails the test
    with its traceback, as it would show one to the user. For the error paths, which stop before
    any work, so the subprocess's import time is not paid a dozen times."""
    import mascot as cli

    monkeypatch.chdir(ROOT)  # relative paths resolve as in mascot()
    capsys.readouterr()
    try:
        code = cli.main(list(args))
    except SystemExit as stop:  # argparse's own errors exit with 2
        code = stop.code
    return code, capsys.readouterr().err


def error_lines(stderr: str) -> list[str]:
    """The lines of stderr that report an error (ours start "error: ", argparse's "prog: error: ")."""
    return [l for l in stderr.splitlines() if l.startswith("error") or "error:" in l]


def test_help_lists_the_subcommands():
    out = mascot("--help")
    assert out.returncode == 0
    for command in ("train", "judge-eval", "simulate"):
        assert command in out.stdout


def test_bad_input_from_the_shell_is_one_line_without_traceback():
    """One error path through a real process: exit status 2, one line, no traceback."""
    out = mascot("train", "--stage", "1", "--model", "tiny", "--personas", "no/such/file.json")
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    errors = error_lines(out.stderr)
    assert len(errors) == 1 and "no/such/file.json" in errors[0], out.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (["train", "--stage", "1", "--group-size", "1"], "--group-size"),
        (["train", "--stage", "2", "--rollout-turns", "0"], "--rollout-turns"),
        (["train", "--stage", "1", "--held-out", "1.5"], "--held-out"),
        (
            ["train", "--stage", "1", "--model", "tiny", "--personas", "no/such/file.json"],
            "no/such/file.json",
        ),
        (["train", "--stage", "1", "--model", "tiny", "--set", "pirates"], "pirates"),
        (
            ["train", "--stage", "1", "--model", "tiny", "--data", "no/such/dataset"],
            "no/such/dataset",
        ),
        (["simulate", "--model", "tiny", "--profile", "grumpy"], "grumpy"),
        (["judge-eval", "--pairs", "no/such/pairs.jsonl"], "no/such/pairs.jsonl"),
        (["judge-eval", "--pairs", "personas.json", "--judge", "magic:thing"], "--judge"),
        (
            ["train", "--stage", "1", "--temperature", "0"],
            "--temperature",
        ),  # would give NaN log-probs
        (["train", "--stage", "1", "--temperature", "-1"], "--temperature"),
        (
            ["train", "--stage", "1", "--model", "tiny", "--held-out", "0"],
            "--held-out",
        ),  # nothing held out
    ],
)
def test_bad_input_is_one_line_without_traceback(args, needle, capsys, monkeypatch):
    code, err = mascot_here(capsys, monkeypatch, *args)
    assert code == 2, err
    lines = [l for l in err.splitlines() if l.strip()]
    assert any(needle in l for l in lines), err
    assert len(error_lines(err)) == 1


def test_evaluate_refuses_a_split_that_differs_from_training(tmp_path, capsys, monkeypatch):
    (tmp_path / "stage1").mkdir()
    (tmp_path / "stage1" / "config.json").write_text(
        json.dumps({"data": "bundled", "set": "support", "seed": 0, "held_out": 0.25})
    )
    code, err = mascot_here(
        capsys, monkeypatch, "evaluate", "--model", "tiny", "--run", str(tmp_path), "--seed", "1"
    )
    assert code == 2
    assert "--seed 1" in err and "--seed 0" in err
    assert not (tmp_path / "eval" / "config.json").exists()


def test_resume_without_checkpoint_is_a_clear_error(tmp_path, capsys, monkeypatch):
    code, err = mascot_here(
        capsys,
        monkeypatch,
        "train",
        "--stage",
        "2",
        "--model",
        "tiny",
        "--run",
        str(tmp_path),
        "--resume",
        "--decision-points",
        "2",
        "--heldout-points",
        "1",
        "--steps",
        "1",
        "--max-new-tokens",
        "4",
        "--rollout-turns",
        "1",
        "--prompts-per-step",
        "1",
        "--group-size",
        "2",
    )
    assert code == 2 and "--resume" in err
    # Stage 1 says so at once too, before any candidate or reward model (nothing is written).
    code, err = mascot_here(
        capsys,
        monkeypatch,
        "train",
        "--stage",
        "1",
        "--model",
        "tiny",
        "--run",
        str(tmp_path / "one"),
        "--resume",
    )
    assert code == 2 and "no GRPO checkpoint" in err
    assert not (tmp_path / "one" / "stage1" / "candidates.jsonl").exists()


def test_stage1_then_stage2_then_simulate_end_to_end_on_tiny(tmp_path):
    run = str(tmp_path / "run")
    s1 = mascot(
        "train",
        "--stage",
        "1",
        "--model",
        "tiny",
        "--run",
        run,
        "--states",
        "8",
        "--heldout-states",
        "4",
        "--steps",
        "2",
        "--prompts-per-step",
        "2",
        "--max-new-tokens",
        "8",
        "--save-every",
        "1",
        "--dump-every",
        "1",
    )
    assert s1.returncode == 0, s1.stdout[-2000:] + s1.stderr[-2000:]
    assert "reward model held-out agreement with the judge" in s1.stdout
    # Not a terminal: one line on stderr as each long phase ends (a bar on a terminal).
    assert all(
        f"{phase}: " in s1.stderr
        for phase in (
            "candidates, batches of states",
            "reward model epoch 1, batches",
            "stage 1 states, agent turns",
        )
    )
    assert "held-out mean reward before GRPO" in s1.stdout and "after GRPO" in s1.stdout
    stage1 = tmp_path / "run" / "stage1"
    for name in (
        "states.jsonl",
        "candidates.jsonl",
        "pairs.jsonl",
        "metrics.jsonl",
        "summary.json",
        "judge_cache.jsonl",
        "speakers/config.json",
        "reward_model/reward_config.json",
    ):
        assert (stage1 / name).exists(), name
    rows = [json.loads(line) for line in (stage1 / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    # The hack diagnostics of the sampled replies are logged with every step.
    assert all(
        0.0 <= row[f"hack_{k}"] <= 1.0
        for row in rows
        for k in (
            "context_copy",
            "persona_copy",
            "history_echo",
            "self_repeat",
            "meta_leak",
            "trivial",
            "word_salad",
        )
    )
    summary = json.loads((stage1 / "summary.json").read_text())
    assert summary["pairs"] > 0 and summary["heldout_after"]["n"] == 8
    pairs = [json.loads(line) for line in (stage1 / "pairs.jsonl").read_text().splitlines()]
    assert {p["hack"] for p in pairs if p.get("hack")} <= set(reward.HACK_KINDS)
    assert any(p.get("hack") for p in pairs)  # synthetic hacks as rejected replies
    rm_metrics = summary["reward_model"]
    assert "heldout_hack_accuracy" in rm_metrics and "heldout_accuracy" in rm_metrics
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(stage1 / "speakers")  # loadable by plain transformers
    # Each saved model folder carries a model card: base, command, metrics, a prompt, the persona cards.
    for folder in ("speakers", "reward_model"):
        card = (stage1 / folder / "README.md").read_text()
        assert (
            "from `tiny`" in card
            and "Command: `python mascot.py train --stage 1 --model tiny" in card
        )
        assert (
            '"role": "system"' in card
            and '"name": "Anchor"' in card
            and "heldout" in card.replace("-", "")
        )

    # Re-running reuses every artifact: the judge cache answers, nothing is judged twice.
    cache_lines = len((stage1 / "judge_cache.jsonl").read_text().splitlines())
    again = mascot(
        "train",
        "--stage",
        "1",
        "--model",
        "tiny",
        "--run",
        run,
        "--states",
        "8",
        "--heldout-states",
        "4",
        "--steps",
        "2",
        "--prompts-per-step",
        "2",
        "--max-new-tokens",
        "8",
        "--resume",
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert len((stage1 / "judge_cache.jsonl").read_text().splitlines()) == cache_lines

    # Best-of-N against the judge and the reward model just trained.
    stress = mascot(
        "judge-stress",
        "--model",
        "tiny",
        "--run",
        run,
        "--n",
        "3",
        "--states",
        "2",
        "--max-new-tokens",
        "6",
    )
    assert stress.returncode == 0, stress.stdout[-2000:] + stress.stderr[-2000:]
    result = json.loads((tmp_path / "run" / "stress" / "results.json").read_text())
    assert (
        set(result["scorers"]) == {"random", "judge", "rm", "persona-id"} and result["states"] == 2
    )
    assert "best-of-3" in stress.stdout and "judge" in stress.stdout
    # The independent evaluator scores every pick; its own pick is the best it can get.
    assert "the independent evaluator" in stress.stdout
    oracle = result["scorers"]["persona-id"]["independent"]["log_ratio"]
    assert oracle[1] >= 0 and all(
        result["scorers"][k]["independent"]["log_ratio"][0] <= oracle[0] + 1e-9
        for k in ("random", "judge", "rm")
    )

    stage2_flags = [
        "train",
        "--stage",
        "2",
        "--model",
        "tiny",
        "--run",
        run,
        "--steps",
        "2",
        "--prompts-per-step",
        "2",
        "--group-size",
        "2",
        "--max-new-tokens",
        "8",
        "--decision-points",
        "4",
        "--heldout-points",
        "2",
        "--rollout-turns",
        "2",
        "--director-warmup",
        "3",
    ]
    s2 = mascot(*stage2_flags)
    assert s2.returncode == 0, s2.stdout[-2000:] + s2.stderr[-2000:]
    assert "held-out mean group reward before" in s2.stdout and "after" in s2.stdout
    assert "warm start 3/3" in s2.stdout and "after the format warm start" in s2.stdout
    stage2 = tmp_path / "run" / "stage2"
    summary2 = json.loads((stage2 / "summary.json").read_text())
    assert (
        len(summary2["warm_start"]["losses"]) == 3 and summary2["warm_start"]["heldout"]["n"] == 2
    )
    assert (stage2 / "director_warm" / "config.json").exists()
    # A resumed run trains on from its GRPO checkpoints, which already hold the warm start.
    again2 = mascot(*stage2_flags, "--resume")
    assert again2.returncode == 0, again2.stderr[-2000:]
    assert "warm start 1/3" not in again2.stdout
    rows = [json.loads(l) for l in (stage2 / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for key in ("r_coherence", "r_nonredundancy", "r_contribution", "r_balance", "r_format"):
        assert key in rows[0]
    assert (stage2 / "director" / "config.json").exists()
    assert "held-out group reward, trained" in (stage2 / "director" / "README.md").read_text()

    sim = mascot(
        "simulate",
        "--model",
        "tiny",
        "--run",
        run,
        "--policy",
        "director",
        "--contexts",
        "2",
        "--turns",
        "2",
        "--max-new-tokens",
        "6",
        "--profile",
        "all",
        "--quiet",
    )
    assert sim.returncode == 0, sim.stderr[-2000:]
    assert " done, " not in sim.stderr  # --quiet: no phase lines
    lines = (tmp_path / "run" / "simulate" / "director.jsonl").read_text().splitlines()
    conv = json.loads(lines[0])
    assert conv["policy"] == "director" and "seed" in conv
    agent_turns = [t for t in conv["turns"] if t["speaker"] not in ("User", "Safety")]
    assert agent_turns and all(t["directive"] for t in agent_turns)


def test_demo_prints_one_conversation_before_and_after_side_by_side(tmp_path, capsys):
    from extras import demo

    def turns(who):
        return [
            {"speaker": "User", "text": "I failed my exam."},
            {"speaker": who, "text": f"{who} answers here."},
        ]

    rows = [
        {"system": "round-robin", "context_id": "c1", "turns": turns("Anchor")},
        {"system": "mascot", "context_id": "c1", "turns": turns("Beacon")},
    ]
    path = tmp_path / "transcripts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    demo.print_side_by_side(path)
    out = capsys.readouterr().out
    assert "before: base speakers, round-robin order" in out and "(mascot)" in out
    line = next(l for l in out.splitlines() if "Anchor answers" in l)
    assert "Beacon answers" in line  # same row: the two columns line up


def test_demo_drops_a_finished_stages_resume_checkpoints_only(tmp_path, capsys):
    from extras import demo

    for name, finished in (("stage1", True), ("stage2", False)):
        ckpt = tmp_path / name / "checkpoints" / "ckpt-000002"
        ckpt.mkdir(parents=True)
        (ckpt / "model.safetensors").write_bytes(b"x" * 1000)
        if finished:
            (tmp_path / name / "summary.json").write_text("{}")
        demo.drop_resume_checkpoints(tmp_path / name)
    assert not (tmp_path / "stage1" / "checkpoints").exists()  # finished: nothing resumes from it
    assert (tmp_path / "stage2" / "checkpoints" / "ckpt-000002").is_dir()  # interrupted: kept
    assert "stage1 finished; its resume checkpoints removed" in capsys.readouterr().out


def test_demo_verdict_shows_groups_of_two_or_more_and_says_whether_a_change_is_beyond_noise():
    from extras import demo

    status = {m.key: "ok" for m in all_metrics()}

    def s(mean, lo, hi):
        return {"mean": mean, "lo": lo, "hi": hi, "n": 3}

    def convs(values):
        return [{"metrics": {"self_bleu": v}} for v in values]

    def systems(n):
        return {
            "round-robin": {
                "n": n,
                "metrics": {k: s(0.5, 0.4, 0.6) for k in status},
                "conversations": convs([0.5] * n),
            },
            "mascot": {
                "n": n,
                "metrics": {k: s(0.6, 0.5, 0.7) for k in status},
                "conversations": convs([0.4] * n),
            },
            "zero-shot": {
                "n": 1,
                "metrics": {k: s(0.2, None, None) for k in status},
                "conversations": convs([0.2]),
            },
        }

    beyond = {"mascot": {"self_bleu": s(-0.1, -0.2, -0.05)}}
    lines = demo.verdict({"status": status, "systems": systems(3), "changes": beyond})
    assert any(l.startswith("mascot ") for l in lines) and not any(
        l.startswith("zero-shot") for l in lines
    )
    # Three pairs all pointing down: the bootstrap interval excludes 0, the sign test cannot (p = 0.25).
    assert lines[-1].startswith(
        "verdict: no change against round-robin is beyond noise: with 3 conversation pairs"
    )
    # Six pairs the same way: p = 2 / 64 < 0.05, and the interval excludes 0 too.
    assert (
        "mascot Self-BLEU -0.100"
        in demo.verdict({"status": status, "systems": systems(6), "changes": beyond})[-1]
    )
    # Six pairs but an interval over 0: still noise.
    noise = {"mascot": {"self_bleu": s(-0.1, -0.2, 0.05)}}
    assert (
        "no change" in demo.verdict({"status": status, "systems": systems(6), "changes": noise})[-1]
    )


TINY_STAGE1 = (
    "train",
    "--stage",
    "1",
    "--model",
    "tiny",
    "--states",
    "4",
    "--heldout-states",
    "2",
    "--candidates",
    "2",
    "--steps",
    "1",
    "--prompts-per-step",
    "1",
    "--group-size",
    "2",
    "--max-new-tokens",
    "4",
    "--rm-epochs",
    "1",
)


def test_a_run_folder_refuses_other_settings_and_other_files(tmp_path, capsys, monkeypatch):
    """config.json records what made a stage folder (flags, a fingerprint of the data and persona files);
    a later command that differs in anything but how, where and how long is refused, naming what
    differs, with or without --resume, before any work: two runs' artifacts never mix."""
    personas = tmp_path / "personas.json"
    personas.write_text((ROOT / "personas.json").read_text())
    run = ["--run", str(tmp_path / "run"), "--personas", str(personas)]
    code, err = mascot_here(capsys, monkeypatch, *TINY_STAGE1, *run)
    assert code == 0, err
    config = (tmp_path / "run" / "stage1" / "config.json").read_text()
    assert json.loads(config)["fingerprint"]
    # An old spelling (--lr, --group-size) is named by its TRL name in the message.
    for extra, named in (
        (["--lr", "1e-4"], "--learning-rate 0.0001"),
        (["--candidates", "3"], "--candidates 3"),
        (["--group-size", "3", "--resume"], "--num-generations 3"),
    ):
        code, err = mascot_here(capsys, monkeypatch, *TINY_STAGE1, *run, *extra)
        assert code == 2 and named in err and "use its settings" in err and "--run" in err, err
    # The same settings, another spelling of the persona file's path: accepted (what counts is its content);
    # a changed card is refused, and --steps (how long) may grow under --resume.
    monkeypatch.chdir(tmp_path)
    code, err = mascot_here(
        capsys,
        monkeypatch,
        *TINY_STAGE1,
        *run[:2],
        "--personas",
        "personas.json",
        "--resume",
        "--steps",
        "2",
    )
    assert code == 0, err
    personas.write_text(personas.read_text().replace("Listens closely", "Listens very closely"))
    code, err = mascot_here(capsys, monkeypatch, *TINY_STAGE1, *run, "--resume", "--steps", "2")
    assert code == 2 and "--personas" in err and "differ from those that made" in err, err
    assert (
        json.loads((tmp_path / "run" / "stage1" / "config.json").read_text())["max_steps"] == 2
    )  # not overwritten


def test_a_second_command_on_a_locked_run_folder_stops_at_once(tmp_path, capsys, monkeypatch):
    """Another process holding the folder's lock (a running train or evaluate): one line, nothing written."""
    (tmp_path / "run").mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
            "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(120)",
            str(tmp_path / "run" / ".lock"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        code, err = mascot_here(capsys, monkeypatch, *TINY_STAGE1, "--run", str(tmp_path / "run"))
        assert code == 2 and "in use by another mascot command" in err, err
        assert not (tmp_path / "run" / "stage1").exists()
        for tool in (
            ("report",),
            ("simulate", "--model", "tiny"),
            ("judge-stress", "--model", "tiny"),
        ):  # extras too
            code, err = mascot_here(capsys, monkeypatch, *tool, "--run", str(tmp_path / "run"))
            assert code == 2 and "in use by another mascot command" in err, (tool, err)
        assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [".lock"]
    finally:
        holder.kill()
    code, err = mascot_here(
        capsys,
        monkeypatch,
        "evaluate",
        "--model",
        "tiny",
        "--run",
        str(tmp_path / "run"),
        "--systems",
        "no-such-system",
    )
    assert "in use" not in err  # the lock went with the process


@pytest.mark.parametrize(
    "args, needle",
    [
        (["train", "--stage", "1", "--device", "tpu"], "--device"),
        (["train", "--stage", "1", "--no-such-flag"], "--no-such-flag"),
        (["train"], "--stage"),
        (["evaluate", "--contexts", "many"], "--contexts"),
        (["simulate", "--device", "tpu"], "--device"),  # a tool in extras/, with its own parser
    ],
)
def test_a_flag_argparse_refuses_is_one_line_not_the_usage(args, needle, capsys, monkeypatch):
    code, err = mascot_here(capsys, monkeypatch, *args)
    lines = [l for l in err.splitlines() if l.strip()]
    assert code == 2 and len(lines) == 1 and needle in lines[0] and "--help" in lines[0], err


def test_bf16_on_a_device_without_it_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    from plumbing import devices

    monkeypatch.setattr(
        devices, "native_bf16", lambda device: False
    )  # a CPU without AVX512-BF16 or AMX
    code, err = mascot_here(
        capsys, monkeypatch, *TINY_STAGE1, "--run", str(tmp_path / "run"), "--dtype", "bfloat16"
    )
    assert code == 2 and "--dtype bfloat16" in err and len(error_lines(err)) == 1, err
    assert not (tmp_path / "run" / "stage1").exists()


def test_a_role_folder_that_is_not_a_model_names_its_own_flag(tmp_path, capsys, monkeypatch):
    (tmp_path / "not-a-model").mkdir()
    code, err = mascot_here(
        capsys,
        monkeypatch,
        "simulate",
        "--model",
        "tiny",
        "--run",
        str(tmp_path / "run"),
        "--contexts",
        "1",
        "--speakers",
        str(tmp_path / "not-a-model"),
    )
    assert code == 2 and "--speakers" in err and "--model" not in err, err


def test_a_read_only_folder_is_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    """train, evaluate, report and simulate on a read-only run folder (simulated: every write under it fails as
    on a read-only mount; as root a chmod would not stop us), and simulate's --out in one: one line, no work."""
    import builtins
    import errno

    ro = tmp_path / "ro"
    ro.mkdir()
    real_open, real_os_open = builtins.open, os.open

    def refuse(path, writing):
        if writing and str(Path(path).resolve()).startswith(str(ro.resolve())):
            raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(
        builtins,
        "open",
        lambda f, mode="r", *a, **k: (
            refuse(f, any(c in mode for c in "wax+")) or real_open(f, mode, *a, **k)
        ),
    )
    monkeypatch.setattr(
        os,
        "open",
        lambda f, flags, *a, **k: (
            refuse(f, flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
            or real_os_open(f, flags, *a, **k)
        ),
    )
    for args in (
        TINY_STAGE1,
        ("evaluate", "--model", "tiny"),
        ("report",),
        ("simulate", "--model", "tiny"),
    ):
        code, err = mascot_here(capsys, monkeypatch, *args, "--run", str(ro))
        assert (
            code == 2
            and "Read-only file system" in err
            and ".lock" in err
            and len(error_lines(err)) == 1
        ), (args, err)
    assert list(ro.iterdir()) == []
    code, err = mascot_here(
        capsys,
        monkeypatch,
        "simulate",
        "--model",
        "tiny",
        "--run",
        str(tmp_path / "run"),
        "--out",
        str(ro / "conversations.jsonl"),
    )
    assert code == 2 and "--out" in err and "Read-only file system" in err, err
    assert not (tmp_path / "run" / "simulate").exists()  # refused before any conversation


def test_a_full_disk_at_a_checkpoint_is_one_line_and_resume_goes_on_exactly(
    tmp_path, capsys, monkeypatch
):
    """ENOSPC while the second checkpoint is written (safetensors wraps the OS error in its own, as here): one
    line that says to free space and --resume; no half checkpoint left; the resumed run ends where an
    uninterrupted one does."""
    real, calls = runs.save_file, []

    def full_disk(tensors, path):
        calls.append(path)
        if len(calls) == 2:
            raise RuntimeError(
                "Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                '"No space left on device" })'
            )
        return real(tensors, path)

    monkeypatch.setattr(runs, "save_file", full_disk)
    run, whole = tmp_path / "run", tmp_path / "whole"
    steps = ("--steps", "3", "--save-every", "1")
    code, err = mascot_here(capsys, monkeypatch, *TINY_STAGE1, *steps, "--run", str(run))
    assert (
        code == 2
        and "No space left on device" in err
        and "--resume" in err
        and len(error_lines(err)) == 1
    ), err
    assert sorted(p.name for p in (run / "stage1" / "checkpoints").iterdir()) == ["ckpt-000001"]
    monkeypatch.setattr(runs, "save_file", real)
    code, err = mascot_here(
        capsys, monkeypatch, *TINY_STAGE1, *steps, "--run", str(run), "--resume"
    )
    assert code == 0, err
    code, err = mascot_here(capsys, monkeypatch, *TINY_STAGE1, *steps, "--run", str(whole))
    assert code == 0, err
    rows = [
        [json.loads(l) for l in (r / "stage1" / "metrics.jsonl").read_text().splitlines()]
        for r in (run, whole)
    ]
    assert [r["step"] for r in rows[0]] == [1, 2, 3]
    assert [(r["reward"], r["loss"]) for r in rows[0]] == [
        (r["reward"], r["loss"]) for r in rows[1]
    ]


def test_cuda_on_a_machine_without_it_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for args in (TINY_STAGE1, ("evaluate", "--model", "tiny"), ("simulate", "--model", "tiny")):
        code, err = mascot_here(
            capsys, monkeypatch, *args, "--run", str(tmp_path / "run"), "--device", "cuda"
        )
        assert code == 2 and "--device cuda" in err and len(error_lines(err)) == 1, (args, err)
    assert not (tmp_path / "run" / "stage1").exists() and not (tmp_path / "run" / "eval").exists()


@pytest.mark.parametrize(
    "command",
    [
        "train",
        "evaluate",
        "demo",
        "simulate",
        "chat",
        "report",
        "sft",
        "strategies",
        "judge-eval",
        "judge-stress",
        "director-headroom",
    ],
)
def test_help_gives_every_flag_a_help_text_and_one_default(command, capsys, monkeypatch):
    import mascot as cli

    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as stop:
        cli.main([command, "--help"])
    text = capsys.readouterr().out
    assert stop.value.code == 0 and "usage:" in text
    entries = []  # one per flag: its line and the indented lines under it
    for line in text.splitlines():
        if line.startswith("  -"):
            entries.append(line)
        elif entries and line.startswith("    ") and line.strip():
            entries[-1] += "  " + line.strip()
    assert len(entries) >= 2 and entries[0].strip().startswith("-h, --help")
    for entry in entries:
        flag, _, help_text = entry.strip().partition("  ")
        assert help_text.strip(), f"{command} {flag}: no help"
        assert entry.count("(default:") <= 1, entry


def test_grpo_flags_carry_trl_names_and_the_old_spellings_still_work():
    parser = cli.build_parser()
    trl = parser.parse_args(
        [
            "train",
            "--stage",
            "1",
            "--num-generations",
            "3",
            "--learning-rate",
            "2e-5",
            "--max-steps",
            "5",
            "--epsilon",
            "0.1",
            "--epsilon-high",
            "0.3",
            "--save-steps",
            "2",
            "--max-completion-length",
            "40",
            "--loss-type",
            "dr_grpo",
            "--scale-rewards",
            "batch",
        ]
    )
    old = parser.parse_args(
        [
            "train",
            "--stage",
            "1",
            "--group-size",
            "3",
            "--lr",
            "2e-5",
            "--steps",
            "5",
            "--eps-low",
            "0.1",
            "--eps-high",
            "0.3",
            "--save-every",
            "2",
            "--max-new-tokens",
            "40",
            "--loss-type",
            "dr_grpo",
            "--scale-rewards",
            "batch",
        ]
    )
    cfg = cli.options(grpo.GRPOConfig, trl, seed=0, max_new_tokens=trl.max_new_tokens)
    assert cfg == cli.options(grpo.GRPOConfig, old, seed=0, max_new_tokens=old.max_new_tokens)
    assert (
        cfg.num_generations,
        cfg.learning_rate,
        cfg.max_steps,
        cfg.epsilon,
        cfg.epsilon_high,
        cfg.save_steps,
        cfg.max_new_tokens,
        cfg.loss_type,
        cfg.scale_rewards,
    ) == (3, 2e-5, 5, 0.1, 0.3, 2, 40, "dr_grpo", "batch")
    with pytest.raises(cli.UserError, match="--scale-rewards"):
        parser.parse_args(
            ["train", "--stage", "1", "--scale-rewards", "yes"]
        )  # TRL's three choices only


def test_a_moved_or_copied_run_folder_resumes(tmp_path, capsys, monkeypatch):
    """A run folder's place is not part of what made it: a copy, or the folder moved elsewhere,
    resumes (config.json's "run" is where it was made)."""
    import shutil

    first = tmp_path / "r1"
    code, err = mascot_here(capsys, monkeypatch, *TINY_STAGE1, "--run", str(first))
    assert code == 0, err
    copy, moved = tmp_path / "r8a", tmp_path / "elsewhere" / "r8b"
    shutil.copytree(first, copy, symlinks=True)
    moved.parent.mkdir()
    shutil.move(first, moved)
    for run in (copy, moved):
        code, err = mascot_here(
            capsys, monkeypatch, *TINY_STAGE1, "--run", str(run), "--resume", "--steps", "2"
        )
        assert code == 0, err
        assert (run / "stage1" / "checkpoints" / "ckpt-000002").is_dir()
        assert json.loads((run / "stage1" / "config.json").read_text())["run"] == str(run)


def test_a_path_inside_the_run_folder_matches_it_where_it_now_lies():
    made = {"run": "/a/r1", "speakers": "/a/r1/stage1/speakers", "model": "tiny"}
    now = {"run": "/b/r8", "speakers": "/b/r8/stage1/speakers", "model": "tiny"}
    assert runs.same_setting("speakers", made, now) and runs.same_setting("model", made, now)
    assert runs.same_setting("speakers", made, {**now, "speakers": made["speakers"]})  # as made
    for other in ("/b/r8/stage1/other", "/b/elsewhere", "/a/r1/stage1/other", None):
        assert not runs.same_setting("speakers", made, {**now, "speakers": other}), other


def test_old_checkpoints_without_resume_are_refused_before_any_work(tmp_path, capsys, monkeypatch):
    """A stage folder holding GRPO checkpoints, run again without --resume: refused at the start,
    not after the states, judging, reward model and held-out pass."""
    run = tmp_path / "run"
    code, err = mascot_here(capsys, monkeypatch, *TINY_STAGE1, "--run", str(run))
    assert code == 0, err

    def work(*args, **kwargs):
        raise AssertionError("work began")

    monkeypatch.setattr(cli, "rlaif_reward", work)
    code, err = mascot_here(capsys, monkeypatch, *TINY_STAGE1, "--run", str(run))
    assert code == 2 and len(error_lines(err)) == 1, err
    assert (
        f"{run / 'stage1' / 'checkpoints'} holds checkpoints of an earlier run; continue it with "
        "--resume, or use a new --run" in err
    )


def test_a_broken_role_folder_is_one_line_naming_its_flag(tmp_path, capsys, monkeypatch):
    from plumbing import files, loading

    folder = files.save_model(*loading.load_model("tiny"), tmp_path / "speakers")
    (folder / "model.safetensors").write_bytes(b"\xff" * 4096)
    code, err = mascot_here(
        capsys,
        monkeypatch,
        "simulate",
        "--model",
        "tiny",
        "--run",
        str(tmp_path / "run"),
        "--contexts",
        "1",
        "--speakers",
        str(folder),
    )
    assert code == 2 and len(error_lines(err)) == 1 and "Traceback" not in err, err
    assert f"--speakers {folder}: a .safetensors file in the folder is damaged" in err
