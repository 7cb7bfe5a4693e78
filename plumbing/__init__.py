"""plumbing: what the method needs but is not the lesson. Skip it on first reading.

common.py    UserError, warnings, progress lines, `option` fields, derived seeds
files.py     crash-safe JSON lines, atomic saves, the cache of paid answers
runs.py      the run lock, each stage's record (config.json), checkpoints, model cards
cli.py       settings dataclasses -> flags; the flags every command shares
loading.py   models by name: the embedded GGUF (converted once), `tiny`, folders, hub ids
devices.py   CPU / CUDA, native bf16, autocast, handing memory back
parallel.py  one process or several (torchrun, DDP)
served.py    an OpenAI-compatible server as the judge or a frozen role
datasets.py  Empathetic Dialogues, ESConv and QMSum in their official formats
results.py   the evaluation's results.md
"""
