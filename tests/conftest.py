"""Shared test set-up: offline mode, the model cache, the repo root on sys.path, real datasets.

Every test runs without network access: the HF_*_OFFLINE variables make transformers fail fast
instead of trying the hub. The converted embedded model is cached in <repo>/.cache (git-ignored)
unless MASCOT_CACHE is already set, so a fresh clone converts it once, in the first test that needs it.
A few tests read the public datasets (ESConv, Empathetic Dialogues, QMSum) from the folder in
MASCOT_DATASETS (default: shared/datasets beside the repository); they are skipped where it is absent.
"""

import os
import sys
from pathlib import Path

import pytest

from plumbing import loading

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("MASCOT_CACHE", str(ROOT / ".cache"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
DATASETS = Path(os.environ.get("MASCOT_DATASETS", ROOT.parent / "shared" / "datasets"))


def dataset(relative: str) -> Path:
    """A file or folder of the public datasets, or skip the calling test when it is not there."""
    path = DATASETS / relative
    if not path.exists():
        pytest.skip(f"{path} not present (set MASCOT_DATASETS)")
    return path


# The two models most tests run on, loaded once per session. Tests that train a model deep-copy it
# first, so every test sees the same weights.
@pytest.fixture(scope="session")
def tiny():
    """The seeded 2-layer random Llama with the SmolLM2 tokenizer (loading.load_model("tiny"))."""
    return loading.load_model("tiny")


@pytest.fixture(scope="session")
def smol():
    """The embedded SmolLM2-135M-Instruct (converted once into the cache)."""
    return loading.load_model("smollm2-135m")
