"""The tables behind sheepop.serve.documents.mathml: what each TeX command of the maths pages becomes in
MathML Core (letters, operators, spaces, functions, accents, fences, alphabets).

Unicode is the only font switch MathML Core has for letters (`mathvariant` is "normal" or
nothing), so \\mathbb{R} is the character U+211D, \\mathbf{x} U+1D431, as TeX would typeset them.
"""

from __future__ import annotations

GREEK = {name: chr(code) for name, code in {
    "alpha": 0x3B1, "beta": 0x3B2, "gamma": 0x3B3, "delta": 0x3B4, "epsilon": 0x3F5,
    "varepsilon": 0x3B5, "zeta": 0x3B6, "eta": 0x3B7, "theta": 0x3B8, "vartheta": 0x3D1,
    "iota": 0x3B9, "kappa": 0x3BA, "lambda": 0x3BB, "mu": 0x3BC, "nu": 0x3BD, "xi": 0x3BE,
    "pi": 0x3C0, "varpi": 0x3D6, "rho": 0x3C1, "varrho": 0x3F1, "sigma": 0x3C3,
    "varsigma": 0x3C2, "tau": 0x3C4, "upsilon": 0x3C5, "phi": 0x3D5, "varphi": 0x3C6,
    "chi": 0x3C7, "psi": 0x3C8, "omega": 0x3C9}.items()}
"""Lower-case Greek: italic, like any one-letter identifier (TeX's \\phi is U+03D5)."""

UPPER_GREEK = {name: chr(code) for name, code in {
    "Gamma": 0x393, "Delta": 0x394, "Theta": 0x398, "Lambda": 0x39B, "Xi": 0x39E, "Pi": 0x3A0,
    "Sigma": 0x3A3, "Upsilon": 0x3A5, "Phi": 0x3A6, "Psi": 0x3A8, "Omega": 0x3A9}.items()}
"""Upper-case Greek: upright in TeX, so <mi mathvariant="normal">."""

IDENTIFIERS = {"ell": "\u2113", "infty": "\u221E", "partial": "\u2202", "nabla": "\u2207",
               "top": "\u22A4", "emptyset": "\u2205", "hbar": "\u210F", "prime": "\u2032",
               "dagger": "\u2020", "intercal": "\u22BA", "Re": "\u211C", "Im": "\u2111"}
"""Symbols that are ordinary atoms (<mi>): W^\\top is W with a superscript, not an operator."""

OPERATORS = {
    "cdot": "\u22C5", "times": "\u00D7", "odot": "\u2299", "otimes": "\u2297", "oplus": "\u2295",
    "pm": "\u00B1", "mp": "\u2213", "div": "\u00F7", "ast": "\u2217", "circ": "\u2218",
    "in": "\u2208", "notin": "\u2209", "subset": "\u2282", "subseteq": "\u2286", "cup": "\u222A",
    "cap": "\u2229", "le": "\u2264", "leq": "\u2264", "ge": "\u2265", "geq": "\u2265",
    "ne": "\u2260", "neq": "\u2260", "approx": "\u2248", "sim": "\u223C", "simeq": "\u2243",
    "equiv": "\u2261", "propto": "\u221D", "ll": "\u226A", "gg": "\u226B", "mid": "\u2223",
    "to": "\u2192", "rightarrow": "\u2192", "leftarrow": "\u2190", "gets": "\u2190",
    "Rightarrow": "\u21D2", "Leftarrow": "\u21D0", "Leftrightarrow": "\u21D4",
    "mapsto": "\u21A6", "implies": "\u27F9", "iff": "\u27FA", "forall": "\u2200",
    "exists": "\u2203", "neg": "\u00AC", "land": "\u2227", "lor": "\u2228", "wedge": "\u2227",
    "vee": "\u2228", "dots": "\u2026", "ldots": "\u2026", "cdots": "\u22EF", "vdots": "\u22EE",
    "ddots": "\u22F1", "colon": ":", "lfloor": "\u230A", "rfloor": "\u230B", "lceil": "\u2308",
    "rceil": "\u2309", "langle": "\u27E8", "rangle": "\u27E9", "lVert": "\u2016",
    "rVert": "\u2016", "Vert": "\u2016", "lvert": "|", "rvert": "|", "vert": "|",
    "{": "{", "}": "}", "|": "\u2016", "setminus": "\u2216", "lbrace": "{", "rbrace": "}",
    "bullet": "\u2219", "star": "\u22C6", "triangleq": "\u225C", "coloneqq": "\u2254",
    "uparrow": "\u2191", "downarrow": "\u2193", "leftrightarrow": "\u2194",
    "longrightarrow": "\u27F6", "perp": "\u22A5", "parallel": "\u2225", "cong": "\u2245"}
"""Operators, relations, arrows and fences: <mo>, spaced by MathML's operator dictionary."""

UNSTRETCHED = frozenset("()[]|/\u2016\u2223\u230A\u230B\u2308\u2309\u27E8\u27E9{}")
"""Fences the operator dictionary would stretch to the height of their whole row: TeX keeps a
plain ( at the size of the text, and so do we, unless \\left, \\right or \\big asks."""

LARGE_OPERATORS = {"sum": "\u2211", "prod": "\u220F", "int": "\u222B", "coprod": "\u2210",
                   "bigcup": "\u22C3", "bigcap": "\u22C2"}
"""Their limits go under and over in a display, beside them inline (movablelimits)."""

FUNCTIONS = ("sin", "cos", "tan", "tanh", "sinh", "cosh", "exp", "log", "ln", "lg", "arg",
             "det", "dim", "ker", "deg", "gcd", "erf", "sec", "csc", "cot", "arcsin", "arccos",
             "arctan", "Pr")
"""Upright names: \\sin x is <mi>sin</mi> then x."""

LIMIT_FUNCTIONS = ("max", "min", "lim", "sup", "inf", "argmax", "argmin")
"""Upright names whose subscript goes underneath in a display: \\max_i."""

IGNORED = ("notag", "nonumber", "label", "tag")
"""Numbering and labels: an equation's number has no place on the page (\\label, \\tag: their
argument too)."""

ESCAPED = {"_": "_", "#": "#", "%": "%", "&": "&", "$": "$"}
"""\\_ and friends: the character itself."""

SPACES = {",": "0.1667em", ":": "0.2222em", ">": "0.2222em", ";": "0.2778em", " ": "0.25em",
          "quad": "1em", "qquad": "2em", "thinspace": "0.1667em", "enspace": "0.5em",
          "!": "-0.1667em"}
"""Horizontal spaces: <mspace width=...> (\\! is a negative thin space)."""

ACCENTS = {"hat": "^", "widehat": "^", "bar": "\u00AF", "overline": "\u00AF", "tilde": "~",
           "widetilde": "~", "vec": "\u2192", "dot": "\u02D9", "ddot": "\u00A8",
           "check": "\u02C7", "breve": "\u02D8", "acute": "\u00B4", "grave": "`"}
"""Accents over their argument: <mover accent="true">."""

UNDER = {"underbrace": "\u23DF", "underline": "_"}
OVER = {"overbrace": "\u23DE"}

SIZED = {"big": "1.2em", "Big": "1.8em", "bigg": "2.4em", "Bigg": "3em"}
"""\\big( and its sizes (also \\bigl, \\bigr, \\bigm): a fence of that height."""

FRACTIONS = {"frac": None, "dfrac": "true", "tfrac": "false"}
"""\\frac and its display-style (\\dfrac) and text-style (\\tfrac) forms."""

TEXT = ("text", "textrm", "textit", "textbf", "texttt", "mbox", "textnormal")
"""Text inside a formula: <mtext>, its spaces kept."""

MATRICES = {"matrix": ("", ""), "pmatrix": ("(", ")"), "bmatrix": ("[", "]"),
            "Bmatrix": ("{", "}"), "vmatrix": ("|", "|"), "Vmatrix": ("\u2016", "\u2016"),
            "cases": ("{", ""), "aligned": ("", ""), "align": ("", ""), "align*": ("", ""),
            "gathered": ("", ""), "array": ("", ""), "split": ("", ""), "equation": ("", ""),
            "equation*": ("", "")}
"""Environments: the table's fences (cases: a brace on the left only)."""

_ALPHABET_STARTS = {"bf": (0x1D400, 0x1D41A, 0x1D7CE), "it": (0x1D434, 0x1D44E, None),
                    "bb": (0x1D538, 0x1D552, 0x1D7D8), "cal": (0x1D49C, 0x1D4B6, None),
                    "frak": (0x1D504, 0x1D51E, None), "sf": (0x1D5A0, 0x1D5BA, 0x1D7E2),
                    "tt": (0x1D670, 0x1D68A, 0x1D7F6)}
_HOLES = {"bb": dict(zip("CHNPQRZ", "\u2102\u210D\u2115\u2119\u211A\u211D\u2124")),
          "cal": dict(zip("BEFHILMRego", "\u212C\u2130\u2131\u210B\u2110\u2112\u2133\u211B"
                                          "\u212F\u210A\u2134")),
          "frak": dict(zip("CHIRZ", "\u212D\u210C\u2111\u211C\u2128")),
          "it": {"h": "\u210E"}}
"""Letters Unicode had before its mathematical alphabets: ℝ is U+211D, not U+1D549."""

ALPHABETS = {"mathbf": "bf", "boldsymbol": "bf", "bm": "bf", "mathit": "it", "mathbb": "bb",
             "mathcal": "cal", "mathscr": "cal", "mathfrak": "frak", "mathsf": "sf",
             "mathtt": "tt"}


def styled(char: str, alphabet: str) -> str:
    """`char` in one of Unicode's mathematical alphabets (a bold x, a double-struck R); a
    character the alphabet lacks is kept as it is."""
    if char in _HOLES.get(alphabet, {}):
        return _HOLES[alphabet][char]
    upper, lower, digits = _ALPHABET_STARTS[alphabet]
    if "A" <= char <= "Z":
        return chr(upper + ord(char) - ord("A"))
    if "a" <= char <= "z":
        return chr(lower + ord(char) - ord("a"))
    if "0" <= char <= "9" and digits is not None:
        return chr(digits + ord(char) - ord("0"))
    return char
