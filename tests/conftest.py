"""Shared fixtures: the golden vLLM trace, a real Qwen tokenizer, a tiny trained tokenizer.
The tiers (fast, e2e) are the plugin tests/tiers.py."""

from __future__ import annotations

import os

# Before anything imports tokenizers/transformers: one thread, no hub.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ["tests.tiers"]  # the fast and e2e tiers

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "data" / "vllm-kv-events"  # the one place every test finds the golden trace
QWEN_CACHE = REPO / ".cache" / "qwen-tokenizer"

TINY_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TINY_CORPUS = [
    "The router renders the prompt exactly as the engine will and hashes full token blocks.",
    "KV cache events tell the router which worker holds which block of which prompt.",
    "def route(request): return min(workers, key=lambda w: w.cost(request))",
    "Prefill work left after the cache credit, plus the decode load already on the worker.",
    "Numbers 0123456789 and unicode: héllo wörld, 毕老师, emoji 😀.",
] * 20


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    """The golden vLLM 0.32 KV-event trace, kept in the repo (``tests/data/vllm-kv-events``)."""
    if not (GOLDEN / "frames.jsonl").is_file():
        pytest.fail(f"golden trace not found at {GOLDEN}: tests/data/vllm-kv-events is missing or incomplete")
    return GOLDEN


@pytest.fixture(scope="session")
def qwen_tokenizer_dir() -> Path:
    """A real Qwen tokenizer dir, built once by scripts/build_qwen_tokenizer.py into .cache/."""
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "build_qwen_tokenizer.py"), str(QWEN_CACHE)],
        check=True, capture_output=True, timeout=300,
    )
    return QWEN_CACHE


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE (a few hundred ids) trained here, with ChatML specials and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TINY_CORPUS, trainer=trainer)
    out = tmp_path_factory.mktemp("tiny-tokenizer")
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "chat_template": TINY_CHATML,
        "model_max_length": 4096,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return out
