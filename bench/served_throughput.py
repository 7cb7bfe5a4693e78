"""bench/served_throughput.py: what does --served-concurrency buy against a llama.cpp server?

Starts llama-cpp-python's server on the embedded SmolLM2 GGUF (the virtual env of `make llama`),
then runs the same small `mascot.py evaluate` with `--judge openai:<server>` (extras/served.py)
once per concurrency value, each in a fresh run folder (so nothing comes from the judge cache),
and prints the wall time, the judge answers (lines of RUN/eval/judge_cache.jsonl) and answers per
second. A few minutes per value on a CPU.

    python bench/served_throughput.py                      # concurrency 1 and 8
    python bench/served_throughput.py --concurrency 1 4 8 --contexts 8 --server-threads 2

What limits the speed-up: llama-cpp-python's server answers one request at a time (one model,
one lock), so concurrency only overlaps HTTP and client work with generation. A server that
batches requests (vLLM; llama.cpp's own `llama-server -np 8`) works on them together.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import models  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(python: str, threads: int):
    gguf = models.package_folder(models.GGUF_PACKAGE) / models.GGUF_FILE
    port = free_port()
    proc = subprocess.Popen([python, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
                             "--port", str(port), "--n_ctx", "2048", "--n_threads", str(threads),
                             "--model_alias", "smollm2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    for _ in range(240):
        try:
            with urllib.request.urlopen(url + "/models", timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    sys.exit("the llama.cpp server did not start")


def evaluate_argv(run: str, url: str, concurrency: int, args) -> list[str]:
    """The `mascot.py evaluate` command line: round-robin, tiny speakers, the server as the judge."""
    return ["evaluate", "--model", "tiny", "--run", run, "--systems", "round-robin", "--contexts", str(args.contexts),
            "--turns", str(args.turns), "--max-new-tokens", "8", "--no-persona-id", "--judge", f"openai:{url}",
            "--judge-model", "smollm2", "--served-concurrency", str(concurrency)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--llama-python", default=str(ROOT / ".venv-llama" / "bin" / "python"))
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    p.add_argument("--contexts", type=int, default=4)
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--server-threads", type=int, default=1)
    args = p.parse_args()
    if not Path(args.llama_python).exists():
        sys.exit(f"{args.llama_python} is missing: run `make llama` first")
    proc, url = start_server(args.llama_python, args.server_threads)
    print(f"llama.cpp server (llama-cpp-python) at {url}, {args.server_threads} thread(s); evaluate: round-robin, "
          f"{args.contexts} contexts x {args.turns} agent turns, tiny speakers, judge = the server")
    try:
        for c in args.concurrency:
            with tempfile.TemporaryDirectory() as run:
                t0 = time.time()
                out = subprocess.run([sys.executable, str(ROOT / "mascot.py"), *evaluate_argv(run, url, c, args)],
                                     capture_output=True, text=True, cwd=ROOT,
                                     env=dict(os.environ, OMP_NUM_THREADS="1"))
                seconds = time.time() - t0
                if out.returncode != 0:
                    sys.exit(out.stderr[-2000:])
                cache = Path(run) / "eval" / "judge_cache.jsonl"
                n = len(cache.read_text().splitlines()) if cache.exists() else 0
                print(f"--served-concurrency {c}: {seconds:6.1f} s wall, {n} judge answers, "
                      f"{n / seconds:.2f} answers/s")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
