"""Post-processors of a Hugging Face tokenizer.json: the special ids put around one text.

For a single text (sheepop never encodes pairs) a post-processor adds ids before and after the
text's own: TemplateProcessing's `single` template (e.g. "<s> $A" for Llama 2: BOS first),
RobertaProcessing / BertProcessing (cls ... sep), ByteLevel (offsets only: no ids), and a
Sequence applies each in turn. `pair` templates only matter for pairs of texts and are not read.
These are the ids `transformers` adds for `tokenizer(text)` (add_special_tokens=True).
"""

from __future__ import annotations

from typing import Any

from sheepop.files import shown
from sheepop.tokenizers.pretrained.spec import Spec, sequence

Affixes = tuple[list[int], list[int]]
"""(ids before the text, ids after it)."""


def template_affixes(data: Any, where: str) -> Affixes:
    """The ids tokenizer.json's "post_processor" puts around a single text."""
    if data is None:
        return [], []
    spec = Spec(data, where)
    kind = spec.type
    if kind == "TemplateProcessing":
        spec.ignore("pair")
        affixes = _template(spec)
    elif kind in ("RobertaProcessing", "BertProcessing"):
        spec.ignore("trim_offsets", "add_prefix_space")
        affixes = [_named_id(spec, "cls")], [_named_id(spec, "sep")]
    elif kind == "ByteLevel":
        spec.ignore("add_prefix_space", "trim_offsets", "use_regex")
        affixes = [], []
    elif kind == "Sequence":
        before: list[int] = []
        after: list[int] = []
        for k, item in enumerate(sequence(spec, "processors")):
            pre, post = template_affixes(item, f"{where}[{k}]")
            before, after = pre + before, after + post
        affixes = before, after
    else:
        raise spec.error("this post-processor is not supported (sheepop reads "
                         "TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel, "
                         "Sequence)")
    spec.done()
    return affixes


def _named_id(spec: Spec, key: str) -> int:
    value = spec.get(key, list)
    if len(value) != 2 or not isinstance(value[0], str) or type(value[1]) is not int:
        raise spec.error(f"'{key}' must be [token, id], not {shown(value)}")
    return value[1]


def _template(spec: Spec) -> Affixes:
    specials = spec.get("special_tokens", dict, {})
    before: list[int] = []
    after: list[int] = []
    seen_text = False
    for item in spec.get("single", list):
        if not isinstance(item, dict) or len(item) != 1:
            raise spec.error(f"a 'single' template item must be one object, not {shown(item)}")
        (what, body), = item.items()
        if what == "Sequence":
            if not isinstance(body, dict) or body.get("id") != "A" or seen_text:
                raise spec.error(f"the 'single' template must hold the text ($A) once, "
                                 f"not {shown(item)}")
            seen_text = True
        elif what == "SpecialToken":
            name = body.get("id") if isinstance(body, dict) else None
            entry = specials.get(name)
            ids = entry.get("ids") if isinstance(entry, dict) else None
            if not isinstance(ids, list) or not all(type(i) is int for i in ids):
                raise spec.error(f"the template's special token {shown(name)} has no ids in "
                                 "'special_tokens'")
            (after if seen_text else before).extend(ids)
        else:
            raise spec.error(f"unknown template item {what!r}")
    if not seen_text:
        raise spec.error("the 'single' template does not hold the text ($A)")
    return before, after
