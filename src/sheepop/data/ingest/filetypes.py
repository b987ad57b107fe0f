"""Which kind of file is this: text, html, code (and its language), pdf, image, jsonl, parquet,
or other.

Magic bytes first (the `filetype` package reads the header), then the extension: a PNG
named notes.txt is an image, a PDF named paper.bin is a PDF. JSON Lines is known by its name
(.jsonl, .ndjson, optionally .gz or .zst; the reader trusts the bytes for the compression),
Parquet by its "PAR1" magic or .parquet. Source code is recognised by
its extension, a few well-known file names, or a "#!" line naming an interpreter.
"""

from __future__ import annotations

from pathlib import PurePath

import filetype

TEXT_EXTENSIONS = frozenset({
    ".txt", ".text", ".md", ".markdown", ".mdown", ".rst", ".rest", ".adoc", ".asciidoc",
    ".org", ".tex", ".bib", ".csv", ".tsv", ".log", ".srt", ".vtt",
})
HTML_EXTENSIONS = frozenset({".html", ".htm", ".xhtml"})
PDF_EXTENSIONS = frozenset({".pdf"})
IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".gif",
                              ".webp", ".pbm", ".pgm", ".ppm", ".pnm", ".jp2"})
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz", ".jsonl.zst", ".ndjson.zst")
COMPRESSED_MAGIC = (b"\x1f\x8b", b"\x28\xb5\x2f\xfd")  # gzip, zstd
PARQUET_MAGIC = b"PAR1"
IMAGE_MIMES = frozenset({"image/png", "image/jpeg", "image/tiff", "image/bmp", "image/gif",
                         "image/webp", "image/x-portable-pixmap", "image/jp2"})

CODE_LANGUAGES = {
    ".py": "python", ".pyi": "python", ".pyx": "cython", ".ipynb": "jupyter",
    ".c": "c", ".h": "c", ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".hpp": "cpp",
    ".hh": "cpp", ".hxx": "cpp", ".cu": "cuda", ".cuh": "cuda", ".m": "objective-c",
    ".mm": "objective-c", ".cs": "csharp", ".java": "java", ".kt": "kotlin", ".kts": "kotlin",
    ".scala": "scala", ".groovy": "groovy", ".go": "go", ".rs": "rust", ".swift": "swift",
    ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript", ".jsx": "javascript",
    ".ts": "typescript", ".tsx": "typescript", ".vue": "vue", ".svelte": "svelte",
    ".css": "css", ".scss": "scss", ".less": "less", ".rb": "ruby", ".php": "php",
    ".pl": "perl", ".pm": "perl", ".lua": "lua", ".r": "r", ".jl": "julia", ".hs": "haskell",
    ".ml": "ocaml", ".mli": "ocaml", ".fs": "fsharp", ".ex": "elixir", ".exs": "elixir",
    ".erl": "erlang", ".clj": "clojure", ".lisp": "lisp", ".el": "emacs-lisp",
    ".scm": "scheme", ".dart": "dart", ".zig": "zig", ".nim": "nim", ".v": "verilog",
    ".sv": "systemverilog", ".vhd": "vhdl", ".f90": "fortran", ".f": "fortran",
    ".asm": "assembly", ".s": "assembly", ".sh": "shell", ".bash": "shell", ".zsh": "shell",
    ".fish": "fish", ".ps1": "powershell", ".bat": "batch", ".sql": "sql", ".proto": "protobuf",
    ".json": "json", ".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".ini": "ini",
    ".cfg": "ini", ".xml": "xml", ".cmake": "cmake", ".mk": "make", ".gradle": "groovy",
    ".tf": "terraform", ".nix": "nix", ".vim": "vim", ".sol": "solidity",
}
CODE_FILENAMES = {
    "makefile": "make", "gnumakefile": "make", "dockerfile": "dockerfile",
    "cmakelists.txt": "cmake", "rakefile": "ruby", "gemfile": "ruby", "justfile": "just",
    "vagrantfile": "ruby", "build": "starlark", "workspace": "starlark",
}
_SHEBANG_LANGUAGES = {"python": "python", "sh": "shell", "bash": "shell", "zsh": "shell",
                      "node": "javascript", "perl": "perl", "ruby": "ruby", "lua": "lua",
                      "php": "php", "Rscript": "r"}


def _shebang_language(head: bytes) -> str | None:
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if not words:
        return None
    program = words[0].rsplit("/", 1)[-1]
    if program == "env" and len(words) > 1:
        program = words[1]
    program = program.rstrip("0123456789.")  # python3.11 -> python
    return _SHEBANG_LANGUAGES.get(program)


def classify(path: str | PurePath, head: bytes) -> tuple[str, str | None]:
    """(type, language) of a file named `path` whose first bytes are `head`.

    type is one of "text", "html", "code", "pdf", "image", "jsonl", "parquet", "other";
    language is set for code.
    """
    name = PurePath(path).name
    suffix = PurePath(name).suffix.lower()
    binary = _binary_type(name, suffix, head)
    return binary if binary is not None else _text_type(name, suffix, head)


def _binary_type(name: str, suffix: str, head: bytes) -> tuple[str, None] | None:
    """The type of a file whose bytes or name say it is not plain text (parquet, JSON Lines,
    PDF, an image, or another format `filetype` knows), else None. The bytes win over the
    name, except that a .jsonl.gz or .zst stays JSON Lines."""
    kind = filetype.guess(head) if head else None
    if head.startswith(PARQUET_MAGIC) or suffix == ".parquet":
        return "parquet", None
    if name.lower().endswith(JSONL_SUFFIXES) and (kind is None
                                                  or head.startswith(COMPRESSED_MAGIC)):
        return "jsonl", None
    if kind is not None:
        if kind.mime == "application/pdf":
            return "pdf", None
        if kind.mime in IMAGE_MIMES:
            return "image", None
    elif head.startswith(b"%PDF-"):
        return "pdf", None
    if suffix in PDF_EXTENSIONS:
        return "pdf", None   # a damaged header: the PDF reader says what is wrong
    if suffix in IMAGE_EXTENSIONS:
        return "image", None
    if kind is not None:
        return "other", None  # an archive, audio, a font ... whatever its name says
    return None


def _text_type(name: str, suffix: str, head: bytes) -> tuple[str, str | None]:
    """The type of a text file, by its name, suffix or shebang line: html, code (with its
    language), text, or other for a suffix sheepop does not read."""
    if suffix in HTML_EXTENSIONS:
        return "html", None
    lowered = name.lower()
    if lowered in CODE_FILENAMES:
        return "code", CODE_FILENAMES[lowered]
    if suffix in CODE_LANGUAGES:
        return "code", CODE_LANGUAGES[suffix]
    if suffix in TEXT_EXTENSIONS:
        return "text", None
    language = _shebang_language(head)
    if language is not None:
        return "code", language
    if not suffix:
        return "text", None   # README, LICENSE, NOTES: read if the bytes are text
    return "other", None
