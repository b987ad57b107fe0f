"""`sheepop tokenizer train|encode|decode|info|export|import`: tokenizers on the command line.

    sheepop tokenizer train CORPUS... --kind bpe --vocab-size 4096 --out tok.json
    sheepop tokenizer encode tok.json "some text"          (or - to read stdin)
    sheepop tokenizer decode tok.json 31 2 7 ...           (or - to read ids from stdin)
    sheepop tokenizer info tok.json
    sheepop tokenizer export tok.json --to hf tokenizer.json
    sheepop tokenizer import --gpt2 vocab.json merges.txt --out tok.json
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from sheepop.cli.common import HelpFormatter
from sheepop.cli.writing import writing
from sheepop.config.schema import TOKENIZER_KINDS
from sheepop.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tokenizer", help="train, inspect and use tokenizers",
                       description="Train a tokenizer (char, word, bpe, digits), encode and "
                                   "decode with it, export it to Hugging Face format or import "
                                   "GPT-2 files.")
    ops = p.add_subparsers(dest="tokenizer_command", metavar="ACTION")
    fmt = HelpFormatter

    t = ops.add_parser("train", help="learn a tokenizer from text files", formatter_class=fmt)
    t.add_argument("corpus", nargs="+", metavar="CORPUS",
                   help="UTF-8 text files (- reads stdin); each file is one document")
    t.add_argument("--kind", choices=TOKENIZER_KINDS, default="bpe")
    t.add_argument("--vocab-size", type=int, default=0,
                   help="ids in all, special tokens included (0: the kind's default)")
    t.add_argument("--out", required=True, metavar="TOK.json")
    t.add_argument("--min-freq", type=int, default=1, help="word: keep words seen this often")
    t.add_argument("--lowercase", action="store_true", help="word: lowercase the text first")
    t.add_argument("--pattern", default="gpt2",
                   help="bpe pre-split: gpt2, gpt4, gpt2-exact or a regular expression")
    t.add_argument("--special", action="append", metavar="TOKEN",
                   help="bpe/digits: a special token (repeatable; replaces the default list: "
                        "bpe <|bos|> <|eos|> <|pad|>, digits none)")
    t.add_argument("--backend", choices=("sheepop", "hf"), default="sheepop",
                   help="bpe: train with sheepop's trainer or Hugging Face tokenizers")
    t.add_argument("--workers", type=int, default=0,
                   help="bpe: processes counting the words of a text over 4 million characters (0: "
                        "one per CPU; 1: this process only); the merges are the same either way")
    t.set_defaults(func=run_train)

    e = ops.add_parser("encode", help="print the ids of a text on one line")
    e.add_argument("tokenizer", metavar="TOK.json")
    e.add_argument("text", metavar="TEXT", help="the text, or - to read stdin")
    e.add_argument("--bos", action="store_true", help="start with <|bos|>")
    e.add_argument("--eos", action="store_true", help="end with <|eos|>")
    e.add_argument("--tokens", action="store_true", help="print token names, not ids")
    e.set_defaults(func=run_encode)

    d = ops.add_parser("decode", help="print the text of ids")
    d.add_argument("tokenizer", metavar="TOK.json")
    d.add_argument("ids", nargs="+", metavar="ID", help="token ids, or - to read them from stdin")
    d.add_argument("--skip-special", action="store_true", help="leave special tokens out")
    d.set_defaults(func=run_decode)

    i = ops.add_parser("info", help="describe a tokenizer file")
    i.add_argument("tokenizer", metavar="TOK.json")
    i.add_argument("--show", type=int, default=10,
                   help="show the first SHOW merges / last SHOW tokens")
    i.set_defaults(func=run_info)

    x = ops.add_parser("export", help="write a bpe tokenizer in another format")
    x.add_argument("tokenizer", metavar="TOK.json")
    x.add_argument("--to", choices=("hf", "gpt2"), required=True,
                   help="hf: one tokenizer.json; gpt2: vocab.json and merges.txt in a folder")
    x.add_argument("out", metavar="OUT", help="hf: the file to write; gpt2: a folder")
    x.set_defaults(func=run_export)

    m = ops.add_parser("import", help="make a sheepop tokenizer from GPT-2 files")
    m.add_argument("--gpt2", nargs=2, required=True, metavar=("VOCAB.json", "MERGES.txt"))
    m.add_argument("--out", required=True, metavar="TOK.json")
    m.add_argument("--special", action="append", metavar="TOKEN",
                   help="a special token of vocab.json (default: <|endoftext|>)")
    m.set_defaults(func=run_import)

    p.set_defaults(func=lambda args: _usage(p))


def _usage(p: argparse.ArgumentParser) -> int:
    p.print_help(sys.stderr)
    return 2


def _read_corpus(paths: list[str], pieces: bool = False) -> Iterator[str]:
    """Each file's text; with `pieces`, a file is read 256K characters at a time and given out
    in pieces cut where every word ends (bpe training), so it is never in memory whole."""
    for name in paths:
        if name == "-":
            yield sys.stdin.read()
            continue
        path = Path(name)
        if path.is_dir():
            raise UserError(f"{path} is a folder; pass its files (e.g. {path}/*.txt)")
        try:
            if pieces:
                from sheepop.tokenizers.pretokenize import rejoin_at_safe_cuts
                with path.open(encoding="utf-8") as f:
                    yield from rejoin_at_safe_cuts(iter(lambda: f.read(1 << 18), ""))
            else:
                yield path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UserError(f"corpus file not found: {path}") from None
        except UnicodeDecodeError as e:
            if pieces:  # e.start counts from the block being decoded: find the file's byte
                e = _utf8_error(path) or e
            raise UserError(f"{path} is not UTF-8 text (byte {e.start}); convert it first, "
                            "or use `sheepop prepare`, which detects encodings") from None
        except OSError as e:
            raise UserError(f"cannot read {path}: {e.strerror}") from None


def _utf8_error(path: Path) -> UnicodeDecodeError | None:
    try:
        path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        return e
    return None


def _counting_bytes(texts: Iterator[str], sizes: list[int]) -> Iterator[str]:
    for text in texts:
        sizes.append(len(text.encode("utf-8")))
        yield text


def run_train(args: argparse.Namespace) -> int:
    from sheepop.tokenizers import train_tokenizer
    options: dict = {}
    if args.kind == "word":
        options = {"min_freq": args.min_freq, "lowercase": args.lowercase}
    elif args.kind == "bpe":
        options = {"pattern": args.pattern, "backend": args.backend, "workers": args.workers,
                   "progress": sys.stderr.isatty()}
        if args.special is not None:
            options["special_tokens"] = args.special
    elif args.kind == "digits" and args.special is not None:
        options["special_tokens"] = args.special
    start = time.perf_counter()
    sizes: list[int] = []
    if args.kind == "bpe":  # streamed: counting words needs one piece of a file at a time
        from sheepop.tokenizers.pretokenize import cuts_safely
        pieces = cuts_safely(args.pattern, args.special or ())
        texts: Iterable[str] = _counting_bytes(_read_corpus(args.corpus, pieces), sizes)
    else:
        texts = list(_counting_bytes(_read_corpus(args.corpus), sizes))
    tok = train_tokenizer(args.kind, texts, args.vocab_size, **options)
    with writing(args.out, "the tokenizer"):
        tok.save(args.out)
    size = sum(sizes)
    print(f"{args.kind} tokenizer: {tok.vocab_size} ids ({len(tok.special_tokens)} special) "
          f"from {size:,} bytes in {time.perf_counter() - start:.2f} s -> {args.out}")
    return 0


def run_encode(args: argparse.Namespace) -> int:
    from sheepop.tokenizers import load
    tok = load(args.tokenizer)
    text = sys.stdin.read() if args.text == "-" else args.text
    ids = tok.encode(text, add_bos=args.bos, add_eos=args.eos)
    if args.tokens:
        print(" ".join(repr(tok.id_to_token(i)) for i in ids))
    else:
        print(" ".join(map(str, ids)))
    return 0


def _parse_ids(words: list[str]) -> list[int]:
    if words == ["-"]:
        words = sys.stdin.read().split()
    ids = []
    for w in words:
        try:
            ids.append(int(w))
        except ValueError:
            raise UserError(f"not a token id: {w!r} (ids are integers)") from None
    return ids


def run_decode(args: argparse.Namespace) -> int:
    from sheepop.tokenizers import load
    tok = load(args.tokenizer)
    sys.stdout.write(tok.decode(_parse_ids(args.ids), skip_special=args.skip_special) + "\n")
    return 0


def run_info(args: argparse.Namespace) -> int:
    from sheepop.tokenizers import load
    if args.show < 0:  # before the file: a mistyped flag is said whatever the file holds
        raise UserError(f"--show must be >= 0 (0: no merges or tokens listed), not {args.show}")
    tok = load(args.tokenizer)
    specials = ", ".join(f"{t}={i}" for t, i in tok.special_tokens.items()) or "none"
    print(f"file:           {args.tokenizer}")
    print(f"kind:           {tok.kind}")
    print(f"vocab size:     {tok.vocab_size} (special tokens included)")
    print(f"special tokens: {specials}")
    n = args.show
    if tok.kind == "bpe":
        from sheepop.tokenizers.pretokenize import pattern_name
        print(f"pre-split:      {pattern_name(tok.pattern)}  {tok.pattern}")
        print(f"merges:         {len(tok.merges)}")
        for rank, (a, b) in enumerate(tok.merges[:n]):
            print(f"  merge {rank:>5}: {tok.id_to_token(a)!r} + {tok.id_to_token(b)!r}")
    elif tok.kind == "word" and tok.lowercase:
        print("lowercase:      yes")
    if n:
        ordinary = [i for i in range(tok.vocab_size) if i not in tok.special_tokens.values()]
        shown = ordinary[-n:] if tok.kind == "bpe" else ordinary[:n]
        label = "last tokens" if tok.kind == "bpe" else "first tokens"
        print(f"{label}:    " + " ".join(f"{i}:{tok.id_to_token(i)!r}" for i in shown))
    return 0


def run_export(args: argparse.Namespace) -> int:
    from sheepop.tokenizers import load
    tok = load(args.tokenizer)
    if args.to == "hf":
        from sheepop.tokenizers.hf import export_hf
        export_hf(tok, args.out)
        print(f"wrote {args.out} (Hugging Face tokenizers format)")
    else:
        from sheepop.tokenizers.gpt2 import export_gpt2
        out = Path(args.out)
        export_gpt2(tok, out / "vocab.json", out / "merges.txt")  # type: ignore[arg-type]
        print(f"wrote {out / 'vocab.json'} and {out / 'merges.txt'}")
    return 0


def run_import(args: argparse.Namespace) -> int:
    from sheepop.tokenizers.gpt2 import import_gpt2
    vocab, merges = args.gpt2
    tok = import_gpt2(vocab, merges, special_tokens=args.special)
    tok.save(args.out)
    print(f"bpe tokenizer: {tok.vocab_size} ids, {len(tok.merges)} merges -> {args.out}")
    return 0
