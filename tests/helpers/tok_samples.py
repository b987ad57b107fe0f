"""Sample texts shared by the tokenizer tests."""

PROSE = (
    "The quick brown fox jumps over the lazy dog. It's 3.14159, isn't it? They'll say 'no'.\n"
    "Naïve café owners in Zürich serve crème brûlée; the résumé was e\u0301crit by hand.\n"
    "Emoji 😀👍🏽👨‍👩‍👧 and flags 🇫🇷 sit beside CJK 漢字かなカナ and 한국어 text.\n"
)

# Text that stresses every rule of the pre-split and of byte-level BPE.
VARIED = [
    "The quick brown fox jumps over the lazy dog. It's 3.14159, isn't it? They'll say 'no'.",
    "def f(x):\n    return x ** 2  # square\n\n\n\tif x:\n\t\tpass\r\n",
    "naïve café résumé — e\u0301 a\u0308 Ångström, Ελληνικά, русский текст",
    "emoji 😀👍🏽👨‍👩‍👧 flags 🇫🇷 and CJK 漢字かなカナ 한국어 text",
    "whitespace   runs  \n\n   \t  \u00a0\u2003 end   ",
    "control \x00\x01\x1b[31m\x7f\x1c\x1d\x1e\x1f\x85 characters",
    "<|eos|>special<|bos|> tokens in <|pad|>text<|eos|><|eos|>",
    "numbers 1234567 12,345.67 ١٢٣ ½ ² and 'S 'T 'Re Don'T I'M we'LL",
    "",
    " ",
]
