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
A template proven to be *header, one loop over the messages, footer* is rendered through
``infera.kv.render_cache``: the same text, with the messages an earlier request already
rendered in the same place taken from it (a long conversation's next turn renders its new
messages, not the whole conversation).
Chat prompts are tokenized without added special tokens, as vLLM does for chat.

Loading reads ``tokenizer.json`` with the ``tokenizers`` library only; transformers is
never imported here. A tokenizer converted from tiktoken (Qwen, Llama 3, ...) is encoded
by tiktoken instead when it provably gives the same ids (about 10x faster; see
``_tiktoken_spec``); the check costs about 2 s once at load for a 150k vocabulary.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, overload

import jinja2
from tokenizers import Tokenizer

from infera.kv.chat_template import (
    CHATML_TEMPLATE,
    ContentFormat,
    PreparedTemplate,
    detect_content_format,
    make_env,
    normalize_messages,
)
from infera.kv.codecs import (
    BYTE_LEVEL_SPECIALS,
    ByteCodec,
    Codec,
    HfCodec,
    TiktokenCodec,
    hf_boundaries,
    tiktoken_spec,
)
from infera.kv.plain_render import PlainRecipes
from infera.kv.prompt_cache import DEFAULT_MAX_BYTES, PromptCache
from infera.kv.render_cache import RenderCache
from infera.kv.template_split import split_template
from infera.kv.tokenizer_source import TokenizerNotFoundError, resolve_tokenizer_dir

_RENDER_ARGS = frozenset({"messages", "tools", "documents", "add_generation_prompt"})
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class TokenizerLoadError(ValueError):
    """A tokenizer directory is missing a file or holds one that cannot be read."""


class ChatTemplateError(ValueError):
    """The tokenizer has no usable chat template, or the template rejected the messages."""

# ---------------------------------------------------------------------------------------


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
    """Chat template + tokenizer of one model; safe to share between threads.

    Chat prompts are tokenized through a ``PromptCache`` (``prompt_cache_bytes``, 0 = off)
    when the codec allows it, so a prompt that extends one seen before costs its new part.
    """

    def __init__(
        self,
        codec: Codec,
        templates: dict[str, str],
        special_tokens: dict[str, str],
        name: str = "",
        prompt_cache_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self._codec = codec
        self._prompts = (
            PromptCache(self._encode_plain, codec.boundaries, prompt_cache_bytes, codec.vocab_size,
                        encode_tail=codec.encode_fresh if isinstance(codec, TiktokenCodec) else None,
                        encode_tail_packed=codec.fresh_packer if isinstance(codec, TiktokenCodec) else None,
                        encode_tail_call=codec.fresh_packer_call() if isinstance(codec, TiktokenCodec) else None)
            if codec.boundaries and prompt_cache_bytes > 0 else None
        )
        self._env = make_env()
        self._templates = dict(templates)
        self._compiled = {n: PreparedTemplate(self._env.from_string(t)) for n, t in templates.items()}
        self._formats = {n: detect_content_format(self._env, t) for n, t in templates.items()}
        self._renders = {n: self._render_cache(t, self._formats[n]) for n, t in templates.items()}
        self._special = dict(special_tokens)
        self._special_free = _RENDER_ARGS.isdisjoint(self._special)  # no special token named as a render argument
        # short chats of plain messages from a recipe per shape (infera.kv.plain_render); string content only
        self._plain = {n: self._plain_recipes(t, self._compiled[n]) if self._formats[n] == "string" else None
                       for n, t in templates.items()}
        self._adhoc: dict[str, tuple[PreparedTemplate, ContentFormat, RenderCache | None, PlainRecipes | None]] = {}
        self.name = name
        eos = special_tokens.get("eos_token")
        self._eos_id = codec.token_to_id(eos) if eos is not None else None

    @classmethod
    def from_dir(cls, path: str | Path, chat_template: str | None = None, fast: bool = True,
                 revision: str = "main") -> PromptRenderer:
        """Load ``tokenizer.json`` + ``tokenizer_config.json`` (+ ``chat_template.jinja``) from ``path``.

        ``path`` is a folder, or a model id found in the Hugging Face cache at ``revision``
        (:mod:`infera.kv.tokenizer_source`; never the network).

        ``chat_template`` overrides the directory's template (a literal Jinja template, like
        vLLM's ``--chat-template``). With ``fast`` (the default), a tokenizer converted from
        tiktoken is encoded by tiktoken when it is installed and provably gives the same ids
        (``uses_tiktoken`` says so); otherwise by ``tokenizers``. Raises TokenizerLoadError
        naming a missing or bad file.
        """
        try:
            root = resolve_tokenizer_dir(str(path), revision)
        except TokenizerNotFoundError as exc:
            raise TokenizerLoadError(str(exc)) from exc
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
        data = json.loads(tok_path.read_text(encoding="utf-8"))
        hf = HfCodec(tok, bos_id, eos_id, explicit, hf_boundaries(data, bool(config.get("split_special_tokens"))))
        codec: Codec = hf
        if fast and not config.get("split_special_tokens") and importlib.util.find_spec("tiktoken") is not None:
            spec = tiktoken_spec(data)
            if spec is not None:
                codec = TiktokenCodec(hf, spec)
        return cls(codec, templates, special, name=str(root))

    @classmethod
    def byte_level(cls) -> PromptRenderer:
        """A file-free renderer: ids are UTF-8 bytes (0..255) plus ChatML specials (256..258)."""
        special = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
        return cls(ByteCodec(BYTE_LEVEL_SPECIALS), {"default": CHATML_TEMPLATE}, special, name="byte-level")

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
        return isinstance(self._codec, TiktokenCodec)

    @property
    def prompt_cache(self) -> PromptCache | None:
        """The chat prompts' token cache, or None when the codec cannot reuse prefixes."""
        return self._prompts

    @property
    def has_chat_template(self) -> bool:
        return bool(self._compiled)

    def content_format(self, tools: list[dict[str, Any]] | None = None) -> ContentFormat:
        """How message content reaches the template that ``render_chat`` would pick."""
        return self._pick(tools, None)[1]

    @property
    def render_caches(self) -> dict[str, RenderCache]:
        """The named templates' per-message render caches (templates whose shape allows one)."""
        return {n: c for n, c in self._renders.items() if c is not None}

    # -- rendering -----------------------------------------------------------------------

    def _render_cache(self, template: str, fmt: ContentFormat) -> RenderCache | None:
        split = split_template(self._env, template)
        return RenderCache(split, fmt) if split is not None else None

    def _plain_recipes(self, template: str, prepared: PreparedTemplate) -> PlainRecipes | None:
        if not self._special_free:
            return None
        return PlainRecipes.build(self._env, template, prepared.render_vars,
                                  {"tools": None, "documents": None, **self._special})

    def prime_plain_chats(self) -> int:
        """:meth:`PlainRecipes.prime` for the template a plain chat renders with (a server's start): the shapes
        learnt, 0 without a template or recipes for it."""
        try:
            plain = self._pick(None, None)[3]
        except ChatTemplateError:
            return 0
        return plain.prime() if plain is not None else 0

    @property
    def plain_recipes(self) -> dict[str, PlainRecipes]:
        """The named templates' recipes for short chats of plain messages (templates proven to allow them)."""
        return {n: p for n, p in self._plain.items() if p is not None}

    def _pick(self, tools: list[dict[str, Any]] | None, override: str | None
              ) -> tuple[PreparedTemplate, ContentFormat, RenderCache | None, PlainRecipes | None]:
        name: str | None
        if override is not None:
            if override in self._compiled:
                name = override
            else:  # a literal template; compiled once per renderer, rendered whole (no per-template cache)
                if override not in self._adhoc:
                    self._adhoc[override] = (
                        PreparedTemplate(self._env.from_string(override)), detect_content_format(self._env, override),
                        None, None,
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
        return self._compiled[name], self._formats[name], self._renders[name], self._plain[name]

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
        template, fmt, cache, plain = self._pick(tools, override)
        if plain is not None and tools is None and not template_kwargs:
            text = plain.render(messages, add_generation_prompt)  # a short chat of plain messages: no jinja
            if text is not None:
                return text
        context = {**self._special, **template_kwargs}
        if cache is not None and len(messages) >= cache.min_messages and _RENDER_ARGS.isdisjoint(context):
            # the same text, the messages seen in an earlier request's prefix not rendered again
            text = cache.render(messages, {"tools": tools, "documents": None,
                                           "add_generation_prompt": add_generation_prompt, **context})
            if text is not None:
                return text
        try:
            if not template_kwargs and self._special_free:  # the special tokens only: one dict made here
                return template.render_vars({"messages": normalize_messages(messages, fmt), "tools": tools,
                                             "documents": None, "add_generation_prompt": add_generation_prompt,
                                             **self._special})
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

    def _encode_plain(self, text: str) -> list[int]:
        return self._codec.encode(text, False)

    def chat_token_ids(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        **kw: Any,
    ) -> list[int]:
        """``encode(render_chat(messages, tools, **kw))`` without added special tokens, as vLLM does.

        The ids of a leading part seen in an earlier prompt are reused (see ``PromptCache``);
        the result is the same list either way (a ``PromptIds`` that also carries known block
        hashes for ``infera.kv.hashing.block_hashes``). Callers must not rely on its type.
        """
        return self.encode_chat(self.render_chat(messages, tools, **kw))

    def encode_chat(self, text: str) -> list[int]:
        """The ids of a chat prompt ``render_chat`` made: ``chat_token_ids``' second half."""
        if self._prompts is not None:
            return self._prompts.encode(text)
        return self._encode_plain(text)

    def encode_chat_ids(self, text: str) -> Sequence[int]:
        """``encode_chat(text)``'s ids, perhaps not as a list: a prompt the prompt cache keeps comes as an
        ``infera.kv.hashing.ArrayIds`` over its uint32 array (nothing built per id; its block hashes made
        with it), for a caller that counts and hashes them (the router's context)."""
        if self._prompts is not None:
            out = self._prompts.encode_within(text, None, listed=False)
            assert out is not None
            return out
        return self._encode_plain(text)

    @overload
    def encode_chat_within(self, text: str, most: int) -> list[int] | None: ...

    @overload
    def encode_chat_within(self, text: str, most: int, listed: bool) -> Sequence[int] | None: ...

    def encode_chat_within(self, text: str, most: int, listed: bool = True) -> Sequence[int] | None:
        """``encode_chat(text)`` when at most ``most`` UTF-8 bytes of it are not in the prompt cache (what
        costs: the cached prefix's ids are reused), else None, having done nothing. ``listed`` False: the ids
        perhaps as an ``ArrayIds``, as :meth:`encode_chat_ids` gives them."""
        if self._prompts is not None:
            return self._prompts.encode_within(text, most, listed)
        return self._encode_plain(text) if len(text.encode("utf-8", "surrogatepass")) <= most else None
