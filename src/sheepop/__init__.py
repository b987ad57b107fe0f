"""sheepop: a GPT-style language-model toolkit built from first principles."""

__version__ = "0.1.0"
