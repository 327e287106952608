"""A model folder's tokenizer without transformers, for the views that rebuild a prompt (`posbias trial`, a
report's trial pages, the viewer).

Importing transformers imports torch: 5 to 7 s and 500 MB on this project's CPU machines, to tokenize one
prompt. `LightTokenizer` reads the same files transformers 5 reads for a fast tokenizer: `tokenizer.json`
through the `tokenizers` library (transformers 5 takes the folder's `tokenizer.json` as it is), and the chat
template rendered with jinja2 as `apply_chat_template` renders it (a sandbox with `trim_blocks`,
`lstrip_blocks`, loop controls, `raise_exception`, `strftime_now` and an unescaped `tojson`; the named
special tokens as variables). A view that rebuilds with it checks the prompt against the token figures the
worker stored when it sent it, and rebuilds with transformers' own tokenizer (`full`) where the check does
not pass or there is nothing to check against (`trial_view.rebuilt`), so a difference between the two costs
time, never a wrong prompt.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from posbias.workers.engine import Encoding, Tokenizer

_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
"""The named special tokens transformers passes to a chat template (`special_tokens_map`)."""


class LightTokenizer:
    """The `Tokenizer` interface over a folder's `tokenizer.json` and chat template (see the module)."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        chat_template: str | None,
        special: dict[str, str],
        full: Callable[[], Tokenizer],
    ) -> None:
        self._tokenizer = tokenizer
        self._template_text = chat_template
        self._template: Any = None
        self._special = special
        self._load_full = full
        self._full: Tokenizer | None = None

    @property
    def prompt_bos_id(self) -> None:
        """None: prompts rebuilt for a view are checked against what was stored, not for a BOS."""
        return None

    def has_chat_template(self) -> bool:
        """True when the folder defines a chat template."""
        return bool(self._template_text)

    def apply_chat_template(self, user_text: str) -> str:
        """`user_text` as the single user turn, followed by the assistant's generation prompt."""
        if self._template is None:
            self._template = _compile(self._template_text or "")
        return str(
            self._template.render(
                messages=[{"role": "user", "content": user_text}],
                tools=None,
                documents=None,
                add_generation_prompt=True,
                **self._special,
            )
        )

    def encode(self, text: str, *, add_special_tokens: bool) -> Encoding:
        """Token ids of `text` with each token's character span (special tokens added here span nothing)."""
        encoded = self._tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return Encoding(ids=list(encoded.ids), offsets=list(encoded.offsets))

    def full(self) -> Tokenizer:
        """transformers' own tokenizer of the same folder, loaded on first use and kept."""
        if self._full is None:
            self._full = self._load_full()
        return self._full


def light_tokenizer(folder: Path, *, full: Callable[[], Tokenizer]) -> LightTokenizer | None:
    """The tokenizer in `folder` without transformers, or None where its files are not the kind read here (no
    `tokenizer.json`; several chat templates; a file that does not parse): the caller then loads `full`."""
    try:
        from tokenizers import Tokenizer as RustTokenizer

        tokenizer = RustTokenizer.from_file(str(folder / "tokenizer.json"))
        config = _json(folder / "tokenizer_config.json")
        template = _chat_template(folder, config)
    except Exception:  # a file not read here (tokenizers raises plain Exception): transformers' own reads it
        return None
    if template is not None and not isinstance(template, str):
        return None
    special = {**_named(_json(folder / "special_tokens_map.json")), **_named(config)}
    return LightTokenizer(tokenizer, chat_template=template, special=special, full=full)


def _chat_template(folder: Path, config: dict[str, Any]) -> object:
    """The folder's chat template where transformers 5 looks for it: `chat_template.jinja`, else the tokenizer
    config's `chat_template` (a list of named templates counts as its `default`; without one the caller
    falls back)."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    found = config.get("chat_template")
    if isinstance(found, list):
        return {t.get("name"): t.get("template") for t in found if isinstance(t, dict)}.get("default")
    return found


def _named(config: dict[str, Any]) -> dict[str, str]:
    """The named special tokens in a tokenizer config, as strings (a token may be stored as an AddedToken)."""
    named = {}
    for key in _SPECIAL_TOKENS:
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            named[key] = value
    return named


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    loaded = json.loads(path.read_text(encoding="utf-8"))
    return loaded if isinstance(loaded, dict) else {}


def _compile(template: str) -> Any:
    """`template` compiled as transformers' `_compile_jinja_template` compiles it (its `{% generation %}`
    block, which only marks assistant tokens for training, renders its body)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        tags = {"generation"}  # noqa: RUF012 (jinja2 declares it as an instance attribute)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
    return env.from_string(template)
