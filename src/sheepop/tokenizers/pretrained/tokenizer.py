"""A pretrained model's own tokenizer, read from a Hugging Face tokenizer.json, exactly.

Encoding `text` runs the parts of tokenizer.json in `tokenizers`' order:
1. added tokens with `normalized: false` are cut out of the raw text (added_tokens.py);
2. each remaining piece is normalized (normalizers.py), and added tokens with
   `normalized: true` are cut out of the normalized text;
3. each remaining piece is pre-tokenized into words (pre_tokenizers.py);
4. each word is encoded by the BPE model (bpe_model.py), through a cache of words seen;
5. `encode_for_model` adds the post-processor's ids around the text (post_processors.py).

Decoding maps ids to token strings and runs the decoder (decoders.py).

The model's own BOS / EOS / PAD / UNK tokens come from its tokenizer_config.json (bos_token, ...;
`from_hf_files`) or from a GGUF file's ids (sheepop.tokenizers.gguf_vocab): `bos_id` etc. report
them, whatever their names. Which special ids surround a model input follows `transformers`
5: beside a tokenizer.json, its post-processor alone (transformers drops tokenizer_config.json's
add_bos_token / add_eos_token then); for a GGUF file, its add_bos_token / add_eos_token, which
decide alone ([BOS] text [EOS]), as transformers' GGUF loader does.

The sheepop file of this kind ("kind": "pretrained") holds the tokenizer.json content itself
under "tokenizer_json", the token of each role under "roles", and "add_bos_token" /
"add_eos_token" (null: the post-processor decides).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from sheepop.errors import UserError
from sheepop.files import shown
from sheepop.tokenizers.base import Tokenizer
from sheepop.tokenizers.file_checks import bad_file, check_id_range, read_specials
from sheepop.tokenizers.pretrained.added_tokens import (
    AddedToken,
    AddedTokenMatcher,
    read_added_tokens,
)
from sheepop.tokenizers.pretrained.bpe_model import BPEModel
from sheepop.tokenizers.pretrained.decoders import Decoder
from sheepop.tokenizers.pretrained.normalizers import build_normalizer
from sheepop.tokenizers.pretrained.post_processors import template_affixes
from sheepop.tokenizers.pretrained.pre_tokenizers import build_pre_tokenizer

ROLES = ("bos", "eos", "pad", "unk")
TOP_LEVEL = ("version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer",
             "post_processor", "decoder", "model")
CACHE_LIMIT = 200_000
"""Distinct words remembered by the encoder; the cache is emptied when it is full."""


class PretrainedTokenizer(Tokenizer):
    kind = "pretrained"

    def __init__(self, tokenizer_json: dict[str, Any],
                 roles: Mapping[str, str | None] | None = None,
                 add_bos_token: bool | None = None, add_eos_token: bool | None = None,
                 where: str = "tokenizer.json") -> None:
        """`roles`: the token of "bos", "eos", "pad", "unk" (each a token of the vocabulary, or
        None; unk defaults to the BPE model's unk_token); `add_bos_token` / `add_eos_token`:
        tokenizer_config.json's flags, None when it does not set them."""
        hf = tokenizer_json
        if not isinstance(hf, dict):
            raise UserError(f"{where}: a tokenizer.json must hold a JSON object")
        unknown = sorted(set(hf) - set(TOP_LEVEL))
        if unknown:
            raise UserError(f"{where}: unknown field '{unknown[0]}' (sheepop refuses what it "
                            "cannot honour)")
        for key in ("truncation", "padding"):
            if hf.get(key) is not None:
                raise UserError(f"{where}: '{key}' is set; sheepop encodes whole texts, so a "
                                f"tokenizer.json with {key} is refused (set it to null)")
        self._hf = hf
        self.model = BPEModel(hf.get("model"), f"{where}: model")
        self.added: list[AddedToken] = read_added_tokens(hf.get("added_tokens"), where)
        self._normalize = build_normalizer(hf.get("normalizer"), f"{where}: normalizer")
        self._pre_tokenize = build_pre_tokenizer(hf.get("pre_tokenizer"),
                                                 f"{where}: pre_tokenizer")
        self._post_affixes = template_affixes(hf.get("post_processor"),
                                              f"{where}: post_processor")
        self._decoder = Decoder(hf.get("decoder"), f"{where}: decoder")
        self._names = self._id_names(where)
        super().__init__({t.content: t.id for t in self.added if t.special})
        self._by_name = {**self.model.vocab, **{t.content: t.id for t in self.added}}
        self._raw = AddedTokenMatcher([t for t in self.added if not t.normalized], None)
        self._normalized = AddedTokenMatcher([t for t in self.added if t.normalized],
                                             self._normalize)
        self._has_normalized = any(t.normalized for t in self.added)
        self.roles = self._read_roles(roles or {}, where)
        self.add_bos_token, self.add_eos_token = add_bos_token, add_eos_token
        self._cache: dict[str, list[int]] = {}

    def _id_names(self, where: str) -> list[str | None]:
        """Token string of each id (None for an id no token uses, which decodes to nothing)."""
        vocab = self.model.vocab
        for t in self.added:
            if vocab.get(t.content, t.id) != t.id:
                raise UserError(f"{where}: added token {t.content!r} has id {t.id} but the "
                                f"vocabulary gives it id {vocab[t.content]}")
        check_id_range([*vocab.values(), *(t.id for t in self.added)], where)
        size = 1 + max([*vocab.values(), *(t.id for t in self.added)], default=-1)
        names: list[str | None] = [None] * size
        for name, i in vocab.items():
            names[i] = name
        for t in self.added:
            if names[t.id] not in (None, t.content):
                raise UserError(f"{where}: added token {t.content!r} takes id {t.id}, which "
                                f"is the vocabulary's {names[t.id]!r}")
            names[t.id] = t.content
        return names

    def _read_roles(self, roles: Mapping[str, str | None], where: str) -> dict[str, str | None]:
        out: dict[str, str | None] = {r: roles.get(r) for r in ROLES}
        if out["unk"] is None:
            out["unk"] = self.model.unk_token
        for role, name in out.items():
            if name is not None and name not in self._by_name:
                raise UserError(f"{where}: the {role} token {name!r} is not a token of the "
                                "vocabulary")
        return out

    # ----- the model's special tokens ---------------------------------------------------------

    def _role_id(self, role: str) -> int | None:
        name = self.roles[role]
        return None if name is None else self._by_name[name]

    @property
    def bos_id(self) -> int | None:
        return self._role_id("bos")

    @property
    def eos_id(self) -> int | None:
        return self._role_id("eos")

    @property
    def pad_id(self) -> int | None:
        return self._role_id("pad")

    @property
    def unk_id(self) -> int | None:
        return self._role_id("unk")

    @property
    def special_affixes(self) -> tuple[list[int], list[int]]:
        """The ids put before and after a model input (transformers' rule, module docstring)."""
        if self.add_bos_token is None and self.add_eos_token is None:
            return list(self._post_affixes[0]), list(self._post_affixes[1])
        bos, eos = self.bos_id, self.eos_id
        return ([bos] if self.add_bos_token and bos is not None else [],
                [eos] if self.add_eos_token and eos is not None else [])

    # ----- encode -----------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self._names)

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Ids of `text` with no special ids added unless asked: add_bos puts the model's BOS
        first, add_eos its EOS last (`encode_for_model` adds what the model's tokenizer adds)."""
        if not isinstance(text, str):
            raise UserError(f"encode expects text (str), got {type(text).__name__}")
        ids = [self._needed("bos")] if add_bos else []
        for piece, token, at_start in self._pieces(text):
            if token is not None:
                ids.append(token.id)
            else:
                ids.extend(self._encode_piece(piece, at_start))
        if add_eos:
            ids.append(self._needed("eos"))
        return ids

    def _needed(self, role: str) -> int:
        i = self._role_id(role)
        if i is None:
            raise UserError(f"this {self.kind} tokenizer has no {role.upper()} token")
        return i

    def _pieces(self, text: str) -> Iterator[tuple[str, AddedToken | None, bool]]:
        """(normalized text, None, starts the text) and (matched text, its added token, _)."""
        offset = 0
        for piece, token in self._raw.split(text):
            at_start, offset = offset == 0, offset + len(piece)
            if token is not None:
                yield piece, token, False
                continue
            normalized = self._normalize(piece) if self._normalize else piece
            if not self._has_normalized:
                yield normalized, None, at_start
                continue
            for k, (sub, sub_token) in enumerate(self._normalized.split(normalized)):
                yield sub, sub_token, at_start and k == 0

    def _encode_piece(self, text: str, at_start: bool) -> list[int]:
        words = self._pre_tokenize([text], at_start)[0] if self._pre_tokenize else [text]
        cache, out = self._cache, []
        for word in words:
            ids = cache.get(word)
            if ids is None:
                if len(cache) >= CACHE_LIMIT:
                    cache.clear()  # keeps memory bounded
                ids = cache[word] = self.model.encode_word(word)
            out.extend(ids)
        return out

    def _encode_ordinary(self, text: str) -> list[int]:
        return self.encode(text)

    def split_specials(self, text: str) -> Iterator[tuple[str, int | None]]:
        """(raw text, None) and (special token, its id) pieces: the added tokens matched on
        the raw text (normalized ones stay inside the text pieces)."""
        for piece, token in self._raw.split(text):
            yield piece, (None if token is None else token.id)

    # ----- decode -----------------------------------------------------------------------------

    def decode(self, ids: Iterable[int], skip_special: bool = False,
               errors: str = "replace") -> str:
        """Text of `ids` as `tokenizers` decodes them (special tokens go through the decoder
        too). errors="strict": UserError when the bytes are not valid UTF-8."""
        if errors != "replace":
            return super().decode(ids, skip_special, errors)
        names = []
        for raw in ids:
            i = self.check_id(raw)
            if not (skip_special and i in self._special_by_id) and self._names[i] is not None:
                names.append(self._names[i])
        return self._decoder.decode(names)

    def _piece(self, i: int, prev: int | None, skip_special: bool) -> bytes:
        if skip_special and i in self._special_by_id:
            return b""
        return self._piece_bytes(i, prev)

    def _piece_bytes(self, i: int, prev: int | None) -> bytes:
        name = self._names[i]
        return b"" if name is None else self._decoder.token_bytes(name, prev is None)

    def _token_str(self, i: int) -> str:
        return self._names[i] or ""

    def _str_to_id(self, token: str) -> int | None:
        return self._by_name.get(token)

    # ----- files ------------------------------------------------------------------------------

    def to_hf_dict(self) -> dict[str, Any]:
        """The Hugging Face tokenizer.json content (what `tokenizers.Tokenizer.from_str` reads);
        explicit add_bos_token / add_eos_token (a GGUF's) become its post-processor, the only
        rule transformers reads beside a tokenizer.json."""
        hf = copy.deepcopy(self._hf)
        if self.add_bos_token is not None or self.add_eos_token is not None:
            before, after = self.special_affixes
            names = {i: self._names[i] for i in before + after}
            items = [*({"SpecialToken": {"id": names[i], "type_id": 0}} for i in before),
                     {"Sequence": {"id": "A", "type_id": 0}},
                     *({"SpecialToken": {"id": names[i], "type_id": 0}} for i in after)]
            hf["post_processor"] = {
                "type": "TemplateProcessing", "single": items, "pair": items,
                "special_tokens": {n: {"id": n, "ids": [i], "tokens": [n]}
                                   for i, n in names.items()}}
        return hf

    def _payload(self) -> dict[str, Any]:
        return {"tokenizer_json": self._hf, "roles": dict(self.roles),
                "add_bos_token": self.add_bos_token, "add_eos_token": self.add_eos_token}

    def _payload_with_specials(self, payload: dict[str, Any], added: dict[str, int]) -> None:
        tokens = payload["tokenizer_json"].setdefault("added_tokens", [])
        tokens.extend(AddedToken(i, t).to_dict() for t, i in added.items())

    @classmethod
    def _from_payload(cls, data: dict[str, Any], where: str) -> PretrainedTokenizer:
        roles = data.get("roles", {})
        if not isinstance(roles, dict) or not all(
                r in ROLES and (n is None or isinstance(n, str)) for r, n in roles.items()):
            raise bad_file(where, f"'roles' must map {', '.join(ROLES)} to token strings")
        flags = [data.get("add_bos_token"), data.get("add_eos_token")]
        if not all(f is None or isinstance(f, bool) for f in flags):
            raise bad_file(where, "add_bos_token and add_eos_token must be true, false or null")
        tok = cls(data.get("tokenizer_json"), roles, *flags, where=f"{where}: tokenizer_json")
        if read_specials(data, where) != tok.special_tokens:
            raise bad_file(where, "'special_tokens' differ from the special added tokens of "
                                  f"its tokenizer_json ({shown(tok.special_tokens)})")
        return tok

    @classmethod
    def train(cls, *args: Any, **kwargs: Any) -> PretrainedTokenizer:
        raise UserError("a pretrained tokenizer is not trained: it comes with its model "
                        "(sheepop import reads it); train a bpe tokenizer instead")
