"""Render chat prompts and tokenize them exactly as the engine will.

``PromptRenderer`` is the one place that turns OpenAI-style messages into the token ids
the engine prefills, so the router's block hashes line up with the engine's cache.

Rendering follows vLLM's chat path, then ``transformers.apply_chat_template``:

1. vLLM message parsing. The template's *content format* is detected once from its AST,
   as vLLM does: a template that loops over ``message.content`` gets content as a list of
   ``{"type": "text", "text": ...}`` parts ("openai"); any other gets a string ("string"),
   where text parts are joined with ``"\\n"`` and ``None`` content becomes ``""``. Only the
   keys vLLM keeps survive (role, content, name, tool_calls, tool_call_id, reasoning);
   tool-call ``arguments`` given as a JSON string are decoded to a dict and an empty
   ``tool_calls`` list is dropped. Non-text parts (images, audio) are skipped in string
   format (their placeholders are model specific) and kept as ``{"type": <modality>}``.
2. transformers normalisation: keys whose value is ``None`` are dropped and reasoning is
   aliased to ``reasoning_content`` and ``thinking``.
3. The Jinja template, compiled once in an ``ImmutableSandboxedEnvironment`` with
   ``trim_blocks`` and ``lstrip_blocks`` and the globals and filters transformers adds
   (``raise_exception``, ``tojson``, ``strftime_now``, ``dict``, ``namespace``,
   ``{% generation %}``, loop controls), with the named special tokens as variables.

For string content the result equals ``apply_chat_template(..., tokenize=False)``.
Chat prompts are tokenized without added special tokens, as vLLM does for chat.

Loading reads ``tokenizer.json`` with the ``tokenizers`` library only; transformers is
never imported here. A tokenizer converted from tiktoken (Qwen, Llama 3, ...) is encoded
by tiktoken instead when it provably gives the same ids (about 10x faster; see
``_tiktoken_spec``); the check costs about 2 s once at load for a 150k vocabulary.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import unicodedata
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal, Protocol

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

ContentFormat = Literal["string", "openai"]

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text", "refusal", "thinking"})
_MEDIA_PART_TYPES = {
    "image_url": "image", "input_image": "image", "image_pil": "image", "image_embeds": "image",
    "audio_url": "audio", "input_audio": "audio", "audio_embeds": "audio", "video_url": "video",
}
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")

BYTE_LEVEL_SPECIALS = {"<|im_start|>": 256, "<|im_end|>": 257, "<|endoftext|>": 258}
CHATML_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages and messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (loop.first and message['role'] == 'system') %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


class TokenizerLoadError(ValueError):
    """A tokenizer directory is missing a file or holds one that cannot be read."""


class ChatTemplateError(ValueError):
    """The tokenizer has no usable chat template, or the template rejected the messages."""


# ---------------------------------------------------------------------------------------
# Codecs: text <-> token ids


class _Codec(Protocol):
    vocab_size: int

    def encode(self, text: str, add_special_tokens: bool) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str: ...

    def token_to_id(self, token: str) -> int | None: ...


class _HfCodec:
    """A ``tokenizers.Tokenizer``, with transformers' explicit add_bos/add_eos override."""

    def __init__(self, tok: Tokenizer, bos_id: int | None, eos_id: int | None, explicit: bool) -> None:
        self._tok = tok
        self._encode = tok.encode
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        # transformers >= 5 replaces the post-processor when tokenizer_config.json sets
        # add_bos_token/add_eos_token explicitly; otherwise tokenizer.json's post-processor rules.
        self._explicit = explicit
        self._bos = [bos_id] if bos_id is not None else []
        self._eos = [eos_id] if eos_id is not None else []

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if add_special_tokens and self._explicit:
            return self._bos + self._encode(text, add_special_tokens=False).ids + self._eos
        return self._encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)


class _TiktokenCodec:
    """tiktoken's BPE for a tokenizer.json converted from a tiktoken vocabulary (Qwen, Llama 3, ...).

    About 10x faster than ``tokenizers`` on the same text. Used only for encoding without
    added special tokens (the chat path), and only when ``_tiktoken_spec`` proves that the
    tokenizer.json's merges are exactly tiktoken's rank rule; anything else goes to ``hf``.
    """

    def __init__(self, hf: _HfCodec, spec: _TiktokenSpec) -> None:
        import tiktoken

        self._hf = hf
        self._nfc = spec.nfc
        self._enc = tiktoken.Encoding(
            "infera", pat_str=spec.pattern, mergeable_ranks=spec.ranks, special_tokens=spec.specials
        )
        self._encode = self._enc.encode
        self.vocab_size = hf.vocab_size

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if add_special_tokens:
            return self._hf.encode(text, True)
        if self._nfc and not text.isascii():
            text = unicodedata.normalize("NFC", text)
        return self._encode(text, allowed_special="all")

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        return self._hf.decode(ids, skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._hf.token_to_id(token)


@dataclasses.dataclass(slots=True)
class _TiktokenSpec:
    pattern: str
    ranks: dict[bytes, int]
    specials: dict[str, int]
    nfc: bool


_GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, char -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _tiktoken_spec(data: dict[str, Any]) -> _TiktokenSpec | None:
    """The tiktoken equivalent of a parsed tokenizer.json, or None when it is not exactly one.

    Exact means: byte-level BPE with ``ignore_merges``, a Split(regex) + ByteLevel
    pre-tokenizer (or ByteLevel with GPT-2's regex), no normaliser or NFC, plain added
    tokens, and merges that are complete and ordered by the merged token's id, so that
    "merge the adjacent pair with the lowest merge rank" equals tiktoken's "merge the
    adjacent pair whose concatenation has the lowest rank". (Both then differ only when
    two overlapping pairs produce the same token, e.g. ab+a and a+ba; such vocabularies
    are vanishingly rare and it costs a cache hit, not correctness.)
    """
    model = data.get("model") or {}
    if model.get("type") != "BPE" or not model.get("ignore_merges") or model.get("dropout"):
        return None
    if model.get("byte_fallback") or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return None
    normalizer = data.get("normalizer")
    if normalizer is not None and normalizer.get("type") != "NFC":
        return None
    pre = data.get("pre_tokenizer") or {}
    pattern: str | None = None
    if pre.get("type") == "ByteLevel" and pre.get("use_regex") and not pre.get("add_prefix_space"):
        pattern = _GPT2_PATTERN
    elif pre.get("type") == "Sequence" and len(pre.get("pretokenizers", ())) == 2:
        split, level = pre["pretokenizers"]
        if (
            split.get("type") == "Split" and "Regex" in split.get("pattern", {})
            and split.get("behavior") == "Isolated" and not split.get("invert")
            and level.get("type") == "ByteLevel" and not level.get("use_regex") and not level.get("add_prefix_space")
        ):
            pattern = split["pattern"]["Regex"]
    if pattern is None:
        return None
    specials: dict[str, int] = {}
    for added in data.get("added_tokens", ()):
        if added.get("lstrip") or added.get("rstrip") or added.get("single_word"):
            return None
        specials[added["content"]] = added["id"]
    if any(a != b and b.startswith(a) for a in specials for b in specials):
        return None  # tiktoken would not pick the longest of overlapping added tokens
    vocab: dict[str, int] = model.get("vocab", {})
    decoder = _byte_decoder()
    if any(ch not in vocab for ch in decoder):
        return None
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in model.get("merges", ())]
    merged_ranks = [vocab.get(left + right, -1) for left, right in merges]
    if -1 in merged_ranks or any(a > b for a, b in pairwise(merged_ranks)):
        return None
    pairs = set(merges)
    # Every split of every token into two tokens must be a merge (~1 s for a 150k vocabulary).
    for token in vocab:
        for i in range(1, len(token)):
            left = token[:i]
            if left in vocab:
                right = token[i:]
                if right in vocab and (left, right) not in pairs:
                    return None
    to_latin1 = str.maketrans({ch: chr(b) for ch, b in decoder.items()})
    try:
        ranks = {token.translate(to_latin1).encode("latin-1"): rank for token, rank in vocab.items()}
    except UnicodeEncodeError:  # a char outside the byte-level alphabet
        return None
    return _TiktokenSpec(pattern, ranks, specials, normalizer is not None)


class _ByteCodec:
    """UTF-8 bytes as ids 0..255, plus a few special tokens above them."""

    def __init__(self, specials: dict[str, int]) -> None:
        self._specials = dict(specials)
        self._by_id = {i: t for t, i in specials.items()}
        self._split = re.compile("(" + "|".join(re.escape(t) for t in specials) + ")")
        self.vocab_size = 256 + len(specials)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        ids: list[int] = []
        specials = self._specials
        for i, piece in enumerate(self._split.split(text)):
            if i % 2:
                ids.append(specials[piece])
            elif piece:
                ids.extend(piece.encode("utf-8"))
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        out: list[str] = []
        buf = bytearray()
        for i in ids:
            if 0 <= i < 256:
                buf.append(i)
                continue
            if buf:
                out.append(buf.decode("utf-8", errors="replace"))
                buf.clear()
            token = self._by_id.get(i)
            if token is not None and not skip_special_tokens:
                out.append(token)
        if buf:
            out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    def token_to_id(self, token: str) -> int | None:
        return self._specials.get(token)


# ---------------------------------------------------------------------------------------
# Jinja environment (the one transformers builds for chat templates)


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` renders its body (transformers uses it for masks)."""

    tags = {"generation"}  # noqa: RUF012 - jinja's own class attribute

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Callable[[], str]) -> str:
        return caller()


class _TemplateDict:
    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """A jinja namespace that refuses underscore-prefixed names, as transformers' does."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # jinja's Namespace signature trick
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot store {name!r} on a namespace")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: int | None = None,
    separators: tuple[str, str] | None = None, sort_keys: bool = False,
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _make_env() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


# ---------------------------------------------------------------------------------------
# Content format detection (vLLM's rule: does the template loop over message content?)


def _is_access(node: jinja2.nodes.Node, var: str, key: str | None = None) -> bool:
    """``var`` (or ``var.key`` / ``var['key']``), possibly behind a filter, test or slice."""
    if isinstance(node, jinja2.nodes.Filter | jinja2.nodes.Test):
        return node.node is not None and _is_access(node.node, var, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _is_access(node.node, var, key)
    if key is None:
        return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == var
    if isinstance(node, jinja2.nodes.Getitem):
        return _is_access(node.node, var) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
    if isinstance(node, jinja2.nodes.Getattr):
        return _is_access(node.node, var) and node.attr == key
    return False


def _aliases(root: jinja2.nodes.Template, var: str) -> Iterator[str]:
    """``var`` and every name assigned from it (``{% set msgs = messages[1:] %}``), transitively."""
    seen = {var}
    todo = deque([var])
    yield var
    while todo:
        current = todo.popleft()
        for assign in root.find_all(jinja2.nodes.Assign):
            if isinstance(assign.target, jinja2.nodes.Name) and _is_access(assign.node, current):
                name = assign.target.name
                if name not in seen:
                    seen.add(name)
                    todo.append(name)
                    yield name


def _loop_targets(root: jinja2.nodes.Template, iter_vars: Sequence[str], key: str | None) -> list[str]:
    names: list[str] = []
    for loop in root.find_all(jinja2.nodes.For):
        if isinstance(loop.target, jinja2.nodes.Name) and any(_is_access(loop.iter, v, key) for v in iter_vars):
            names.append(loop.target.name)
    return names


def detect_content_format(env: jinja2.Environment, template: str) -> ContentFormat:
    """"openai" when the template iterates over a message's content, else "string" (vLLM's rule)."""
    try:
        root = env.parse(template)
        message_vars = _loop_targets(root, list(_aliases(root, "messages")), None)
        return "openai" if _loop_targets(root, message_vars, "content") else "string"
    except jinja2.TemplateError:
        return "string"


# ---------------------------------------------------------------------------------------
# Message normalisation


def _parts_to_content(content: Any, fmt: ContentFormat) -> Any:
    if content is None:
        parts: list[Any] = []
    elif isinstance(content, str):
        parts = [content]
    else:
        parts = list(content)
    texts: list[str] = []
    wrapped: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, str):
            text: str | None = part
            media = None
        else:
            kind = part.get("type")
            text = part.get("text") if kind in _TEXT_PART_TYPES or (kind is None and "text" in part) else None
            media = _MEDIA_PART_TYPES.get(kind) if text is None else None
            if text is None and media is None:
                continue
        if text is not None:
            texts.append(text)
            wrapped.append({"type": "text", "text": text})
        elif media is not None:
            wrapped.append({"type": media})
    return "\n".join(texts) if fmt == "string" else wrapped


def _tool_calls(raw: Any) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    for item in raw:
        call = dict(item)
        function = call.get("function")
        if isinstance(function, dict):
            function = dict(function)
            args = function.get("arguments")
            if not args:
                function["arguments"] = {}
            elif not isinstance(args, dict | list):
                function["arguments"] = json.loads(args)
            call["function"] = function
        calls.append(call)
    return calls


def normalize_messages(messages: Sequence[dict[str, Any]], fmt: ContentFormat) -> list[dict[str, Any]]:
    """The messages as vLLM hands them to ``apply_chat_template``, then as transformers passes them on.

    Pure: the caller's dicts are not modified.
    """
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        msg: dict[str, Any] = {"role": role, "content": _parts_to_content(message.get("content"), fmt)}
        if role == "assistant":
            calls = message.get("tool_calls")
            if calls:
                msg["tool_calls"] = _tool_calls(calls)
            reasoning = message.get("reasoning")
            if reasoning is not None:
                msg["reasoning"] = reasoning
                msg["reasoning_content"] = reasoning
        elif role == "tool" and "tool_call_id" in message:
            msg["tool_call_id"] = message["tool_call_id"]
        if isinstance(message.get("name"), str):
            msg["name"] = message["name"]
        # transformers: drop None values, alias reasoning under the names templates read
        msg = {k: v for k, v in msg.items() if v is not None}
        reasoning = next((msg[k] for k in _REASONING_FIELDS if msg.get(k) is not None), None)
        if reasoning is not None:
            msg = {"thinking": reasoning, **msg, "reasoning_content": reasoning}
        out.append(msg)
    return out


# ---------------------------------------------------------------------------------------
# Loading


def _token_str(value: Any) -> str | None:
    """A special token from tokenizer_config.json: a string or a serialised AddedToken."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise TokenizerLoadError(f"missing {path.name} in {path.parent}") from exc
    except (OSError, ValueError) as exc:
        raise TokenizerLoadError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise TokenizerLoadError(f"{path} is not a JSON object")
    return data


def _templates_from_dir(root: Path, config: dict[str, Any]) -> dict[str, str]:
    """Named chat templates, with transformers' precedence: .jinja files over the config."""
    templates: dict[str, str] = {}
    raw = config.get("chat_template")
    if isinstance(raw, str):
        templates["default"] = raw
    elif isinstance(raw, list):
        for item in raw:
            if isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("template"), str):
                templates[item["name"]] = item["template"]
    files: dict[str, str] = {}
    if (root / "chat_template.jinja").is_file():
        files["default"] = (root / "chat_template.jinja").read_text(encoding="utf-8")
    extra = root / "additional_chat_templates"
    if extra.is_dir():
        for path in sorted(extra.glob("*.jinja")):
            files[path.stem] = path.read_text(encoding="utf-8")
    return files or templates


class PromptRenderer:
    """Chat template + tokenizer of one model; immutable after construction, safe to share."""

    def __init__(
        self,
        codec: _Codec,
        templates: dict[str, str],
        special_tokens: dict[str, str],
        name: str = "",
    ) -> None:
        self._codec = codec
        self._env = _make_env()
        self._templates = dict(templates)
        self._compiled = {n: self._env.from_string(t) for n, t in templates.items()}
        self._formats = {n: detect_content_format(self._env, t) for n, t in templates.items()}
        self._special = dict(special_tokens)
        self._adhoc: dict[str, tuple[jinja2.Template, ContentFormat]] = {}
        self.name = name
        eos = special_tokens.get("eos_token")
        self._eos_id = codec.token_to_id(eos) if eos is not None else None

    @classmethod
    def from_dir(cls, path: str | Path, chat_template: str | None = None, fast: bool = True) -> PromptRenderer:
        """Load ``tokenizer.json`` + ``tokenizer_config.json`` (+ ``chat_template.jinja``) from ``path``.

        ``chat_template`` overrides the directory's template (a literal Jinja template, like
        vLLM's ``--chat-template``). With ``fast`` (the default), a tokenizer converted from
        tiktoken is encoded by tiktoken when it is installed and provably gives the same ids
        (``uses_tiktoken`` says so); otherwise by ``tokenizers``. Raises TokenizerLoadError
        naming a missing or bad file.
        """
        root = Path(path)
        if not root.is_dir():
            raise TokenizerLoadError(f"tokenizer directory {root} does not exist")
        tok_path = root / "tokenizer.json"
        if not tok_path.is_file():
            raise TokenizerLoadError(f"missing tokenizer.json in {root}")
        config = _read_json(root / "tokenizer_config.json")
        try:
            tok = Tokenizer.from_file(str(tok_path))
        except Exception as exc:  # the Rust side raises a bare Exception
            raise TokenizerLoadError(f"cannot load {tok_path}: {exc}") from exc
        special_map: dict[str, Any] = {}
        if (root / "special_tokens_map.json").is_file():
            special_map = _read_json(root / "special_tokens_map.json")
        special: dict[str, str] = {}
        for name in SPECIAL_TOKEN_NAMES:
            value = _token_str(config.get(name)) or _token_str(special_map.get(name))
            if value is not None:
                special[name] = value
        if config.get("split_special_tokens"):
            tok.encode_special_tokens = True
        explicit = "add_bos_token" in config or "add_eos_token" in config
        bos, eos = special.get("bos_token"), special.get("eos_token")
        bos_id = tok.token_to_id(bos) if config.get("add_bos_token") and bos is not None else None
        eos_id = tok.token_to_id(eos) if config.get("add_eos_token") and eos is not None else None
        templates = {"default": chat_template} if chat_template is not None else _templates_from_dir(root, config)
        hf = _HfCodec(tok, bos_id, eos_id, explicit)
        codec: _Codec = hf
        if fast and not config.get("split_special_tokens") and importlib.util.find_spec("tiktoken") is not None:
            spec = _tiktoken_spec(json.loads(tok_path.read_text(encoding="utf-8")))
            if spec is not None:
                codec = _TiktokenCodec(hf, spec)
        return cls(codec, templates, special, name=str(root))

    @classmethod
    def byte_level(cls) -> PromptRenderer:
        """A file-free renderer: ids are UTF-8 bytes (0..255) plus ChatML specials (256..258)."""
        special = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
        return cls(_ByteCodec(BYTE_LEVEL_SPECIALS), {"default": CHATML_TEMPLATE}, special, name="byte-level")

    # -- properties ----------------------------------------------------------------------

    @property
    def eos_token_id(self) -> int | None:
        return self._eos_id

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self._codec.vocab_size

    @property
    def special_tokens(self) -> dict[str, str]:
        return dict(self._special)

    @property
    def uses_tiktoken(self) -> bool:
        """True when plain encoding runs on tiktoken (see ``from_dir``)."""
        return isinstance(self._codec, _TiktokenCodec)

    @property
    def has_chat_template(self) -> bool:
        return bool(self._compiled)

    def content_format(self, tools: list[dict[str, Any]] | None = None) -> ContentFormat:
        """How message content reaches the template that ``render_chat`` would pick."""
        return self._pick(tools, None)[1]

    # -- rendering -----------------------------------------------------------------------

    def _pick(self, tools: list[dict[str, Any]] | None, override: str | None) -> tuple[jinja2.Template, ContentFormat]:
        name: str | None
        if override is not None:
            if override in self._compiled:
                name = override
            else:  # a literal template; compiled once per renderer
                if override not in self._adhoc:
                    self._adhoc[override] = (
                        self._env.from_string(override), detect_content_format(self._env, override)
                    )
                return self._adhoc[override]
        elif tools is not None and "tool_use" in self._compiled:
            name = "tool_use"
        elif "default" in self._compiled:
            name = "default"
        elif len(self._compiled) == 1:
            name = next(iter(self._compiled))
        else:
            name = None
        if name is None:
            raise ChatTemplateError(
                f"tokenizer {self.name or '?'} has no chat template"
                + (f" named 'default' (has {sorted(self._compiled)})" if self._compiled else "")
            )
        return self._compiled[name], self._formats[name]

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text the engine builds for these OpenAI-style messages.

        ``template_kwargs`` reach the template as variables (e.g. ``enable_thinking``) and
        override the special tokens; ``chat_template`` picks a named template or passes a
        literal one. Raises ChatTemplateError if there is no template or it raises.
        """
        override = template_kwargs.pop("chat_template", None)
        template, fmt = self._pick(tools, override)
        context = {**self._special, **template_kwargs}
        try:
            return template.render(
                messages=normalize_messages(messages, fmt),
                tools=tools,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **context,
            )
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from exc

    # -- tokens --------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; added special tokens (BOS/EOS) only if asked."""
        return self._codec.encode(text, add_special_tokens)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._codec.decode(ids, skip_special_tokens)

    def chat_token_ids(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        **kw: Any,
    ) -> list[int]:
        """``encode(render_chat(messages, tools, **kw))`` without added special tokens, as vLLM does."""
        return self._codec.encode(self.render_chat(messages, tools, **kw), False)
