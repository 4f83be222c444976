"""GPT-2's byte-level BPE from a model directory, through the `tokenizers` library.

Looks for tokenizer.json, else vocab.json with merges.txt (Hugging Face's two layouts). A
directory without them still runs with ``--prompt-ids``; generated ids are then printed as
numbers.
"""

from pathlib import Path

from .errors import UserError

__all__ = ["Tokenizer", "load_tokenizer"]


class Tokenizer:
    def __init__(self, tok, vocab_size):
        self._tok = tok
        self.vocab_size = vocab_size

    def encode(self, text):
        return list(self._tok.encode(text).ids)

    def decode(self, ids):
        return self._tok.decode(list(ids))


class _Ids:
    """No tokenizer in the model directory: ids in, ids out."""
    vocab_size = None

    def encode(self, text):
        raise UserError("--prompt: the model directory has no tokenizer (tokenizer.json, or "
                        "vocab.json and merges.txt); give the prompt with --prompt-ids")

    def decode(self, ids):
        return "".join(f"[{i}]" for i in ids)


def load_tokenizer(path):
    path = Path(path)
    try:
        if (path / "tokenizer.json").exists():
            from tokenizers import Tokenizer as HfTokenizer
            tok = HfTokenizer.from_file(str(path / "tokenizer.json"))
        elif (path / "vocab.json").exists() and (path / "merges.txt").exists():
            from tokenizers import ByteLevelBPETokenizer
            tok = ByteLevelBPETokenizer(str(path / "vocab.json"), str(path / "merges.txt"))
        else:
            return _Ids()
    except Exception as e:         # the library's own error types for malformed files
        raise UserError(f"--model: the tokenizer files in {path} cannot be read ({e})") from None
    return Tokenizer(tok, tok.get_vocab_size())
