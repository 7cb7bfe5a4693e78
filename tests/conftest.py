"""Shared test set-up: offline mode, the model cache, and the repo root on sys.path.

Every test runs without network access: the HF_*_OFFLINE variables make transformers fail fast
instead of trying the hub. The converted embedded model is cached in <repo>/.cache (git-ignored)
unless MASCOT_CACHE is already set, so a fresh clone converts it once, in the first test that needs it.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("MASCOT_CACHE", str(ROOT / ".cache"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
