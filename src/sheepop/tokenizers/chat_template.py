"""A model's own chat template: Jinja text, rendered in a sandbox as Hugging Face renders it.

A model's tokenizer ships the rule that turns a conversation into text (`chat_template` in
tokenizer_config.json, `tokenizer.chat_template` in GGUF; it arrives on
`Tokenizer.chat_template`). The rule is a Jinja template written by whoever published the model,
so it is code from a stranger: it runs in Jinja's ImmutableSandboxedEnvironment (no attribute
that begins with "_", so no way to Python's internals; no method that changes a list or a dict).
The environment is the one the templates are written for (`transformers`' apply_chat_template):

- trim_blocks and lstrip_blocks (a block tag's own line break and indentation are not output),
  the loop controls {% break %} and {% continue %};
- variables: `messages`, `add_generation_prompt`, `tools` and `documents` (None here), and the
  tokenizer's named special tokens as text (`bos_token`, `eos_token`, `unk_token`, `pad_token`);
- functions: `raise_exception(message)` (the template refuses a conversation),
  `strftime_now(format)` (today's date, for templates that print it), `dict(...)`,
  `namespace(...)` (which refuses names beginning with "_");
- the filter `tojson` as json.dumps (no HTML escaping; indent, separators, sort_keys);
- {% generation %} ... {% endgeneration %}: a block that outputs its body unchanged and marks
  it as written by the assistant (`Rendered.spans`, for the fine-tuning loss mask).

A rendering is bounded in steps, time and size (sheepop.tokenizers.template_budget): a template
that would run for ever or fill memory is stopped inside the rendering. Every failure of a
template (it does not parse, it refuses the conversation, it reaches for something the sandbox
forbids, it fails on the data, it passes a bound) is one UserError line naming the problem.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any, NamedTuple

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.utils import Namespace

from sheepop.errors import UserError
from sheepop.tokenizers.template_bounds import (
    BoundedEnvironment,
    bound_tree,
    bounded_filter,
    check_format,
)
from sheepop.tokenizers.template_budget import RenderLimit, budget_for, joined, spending

TOKEN_VARIABLES = ("bos_token", "eos_token", "unk_token", "pad_token")
"""The special tokens a template may write by name (Hugging Face's names)."""


class Rendered(NamedTuple):
    """The conversation as text; `spans`: (start, end) character ranges of the text that
    {% generation %} blocks output, in order."""
    text: str
    spans: list[tuple[int, int]]


class _Generated(str):
    """Text a {% generation %} block output: a str that says where it came from. Jinja yields a
    call block's result as it is, so the renderer sees the type and notes where it lies."""


class TemplateRefusal(jinja2.TemplateError):
    """What `raise_exception` raises: the template refuses this conversation."""


class GenerationBlocks(Extension):
    """{% generation %} body {% endgeneration %}: the body, marked as the assistant's."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        line = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(line)

    def _mark(self, caller: Any) -> str:
        return _Generated(caller())


def _raise_exception(message: Any) -> None:
    raise TemplateRefusal(str(message))


def _tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    """json.dumps with the options templates pass; Jinja's own filter escapes <, > and & for
    HTML, which would change the prompt."""
    encoder = json.JSONEncoder(ensure_ascii=ensure_ascii, indent=indent,
                               separators=separators, sort_keys=sort_keys)
    return joined(encoder.iterencode(value))  # (an indent multiplies the size: counted)


def _strftime_now(fmt: str) -> str:
    check_format(str(fmt))  # (a width: "%1000000000Y")
    return datetime.now().strftime(fmt)


class _DictMaker:
    """`dict(...)` and `dict.fromkeys(...)` for templates, and no way from it to the class."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, keys: Any, value: Any = None) -> dict:
        return dict.fromkeys(keys, value)


class _Namespace(Namespace):
    """Jinja's namespace (the one mutable object a template has), refusing names that begin
    with "_": such a name could shadow the object's own machinery."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # (Jinja's signature: `self` may be a key)
        self, rest = args[0], args[1:]
        for name in dict(*rest, **kwargs):
            _check_name(name)
        Namespace.__init__(self, *rest, **kwargs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_name(name)
        Namespace.__setitem__(self, name, value)


def _check_name(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"a namespace attribute may not begin with '_' "
                                              f"({name!r})")


def _environment() -> BoundedEnvironment:
    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True,
                             extensions=[GenerationBlocks, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = bounded_filter("tojson", _tojson)
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now,
                       dict=_DictMaker(), namespace=_Namespace)
    return env


_ENV = _environment()


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """The compiled template (cached: a server renders the same template for every request)."""
    if not isinstance(source, str):
        raise UserError(f"a chat template must be text, not {type(source).__name__}")
    try:  # (its loops and literals rewritten to spend the rendering's budget)
        return _ENV.from_string(bound_tree(_ENV.parse(source), _ENV))
    except jinja2.TemplateSyntaxError as e:
        raise UserError(f"the chat template does not parse: {_one_line(e.message or '')} "
                        f"(line {e.lineno})") from None
    except RecursionError:
        raise UserError("the chat template does not parse: it nests deeper than Python's "
                        "stack") from None


def has_generation_blocks(source: str) -> bool:
    """Whether the template marks the assistant's text with {% generation %} blocks."""
    compile_template(source)  # a template that does not parse is its own error
    tree = _ENV.parse(source)
    return any(isinstance(node.call, nodes.Call) and isinstance(node.call.node,
                                                                nodes.ExtensionAttribute)
               and node.call.node.name == "_mark" for node in tree.find_all(nodes.CallBlock))


def _plain(value: Any, where: str) -> Any:
    """A copy of `value` made of JSON's types only (what a conversation is), so the template
    sees no object of ours, and keys whose value is None left out (as Hugging Face does:
    templates test whether a key is there)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v, where) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v, where) for v in value]
    raise UserError(f"{where}: a {type(value).__name__} is not JSON data a template can read")


def render(source: str, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool,
           tokens: Mapping[str, str] | None = None) -> Rendered:
    """The conversation `messages` rendered by the template `source`, with the text of each
    {% generation %} block located. `tokens`: the named special tokens (TOKEN_VARIABLES)."""
    template = compile_template(source)
    variables = {**{k: v for k, v in (tokens or {}).items() if v is not None},
                 "messages": _plain(list(messages), "the conversation"),
                 "add_generation_prompt": bool(add_generation_prompt),
                 "tools": None, "documents": None}
    pieces: list[str] = []
    spans: list[tuple[int, int]] = []
    at = 0
    try:
        with spending(budget_for(variables)) as budget:
            for piece in template.generate(**variables):
                budget.emit(piece)
                if isinstance(piece, _Generated):
                    spans.append((at, at + len(piece)))
                pieces.append(piece)
                at += len(piece)
    except RenderLimit as e:
        raise UserError(f"the chat template was stopped: {e} (a rendering is bounded)"
                        ) from None
    except TemplateRefusal as e:
        raise UserError(f"the chat template refused the conversation: {_one_line(str(e))}"
                        ) from None
    except jinja2.exceptions.SecurityError as e:
        raise UserError(f"the chat template reached for something its sandbox forbids: "
                        f"{_one_line(str(e))}") from None
    except jinja2.TemplateError as e:
        raise UserError(f"the chat template failed: {_one_line(str(e))}") from None
    except (TypeError, ValueError, LookupError, ArithmeticError, AttributeError,
            RecursionError, MemoryError) as e:  # the template's own expressions on this data
        raise UserError(f"the chat template failed: {type(e).__name__}: {_one_line(str(e))}"
                        ) from None
    return Rendered("".join(pieces), spans)
