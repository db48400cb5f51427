"""CLIP's byte-level BPE tokenizer from vocab.json + merges.txt, id for id as HF CLIPTokenizer.

Matches transformers 5.23.0 CLIPTokenizer (the `tokenizers` backend): the special tokens
`<|startoftext|>` / `<|endoftext|>` are split out of the raw text first; each other segment is
NFC-normalised, whitespace runs become one space, and it is lowercased char by char (Rust's
`char::to_lowercase`, so no final-sigma rule); the CLIP regex cuts it into pieces, whose UTF-8
bytes go through GPT-2's bytes_to_unicode and BPE (merges by rank, `</w>` on the last symbol).
Symbols missing from the vocabulary become the unknown token (`<|endoftext|>`). Ids are
bos + tokens[:75] + eos; `pad_ids` pads with the pad id to the 77-token context.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import numpy as np
import regex

from pipeline.errors import NpucamError

BOS_TOKEN = "<|startoftext|>"
EOS_TOKEN = "<|endoftext|>"
CONTEXT_LENGTH = 77
END_OF_WORD = "</w>"


# HF's Split pre-tokenizer pattern (CLIP's, plus the two special strings); matches are kept.
# Letter/number classes are the `regex` package's Unicode tables; HF's Oniguruma tables are
# older, so code points first assigned in the newest Unicode version can differ (docs/clip.md).
_PIECES = regex.compile(
    r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
)

_WHITESPACE = regex.compile(r"\s+")
_SPECIALS = regex.compile(r"(<\|startoftext\|>|<\|endoftext\|>)")
_LETTER = regex.compile(r"\p{L}")
# HF's ByteLevel pre-tokenizer re-splits every piece with GPT-2's regex; that is the identity on
# CLIP's pieces except the special strings written in other case, which it cuts in three.
_LOWERED_SPECIALS = {
    BOS_TOKEN: ("<|", "startoftext", "|>"),
    EOS_TOKEN: ("<|", "endoftext", "|>"),
}


class TokenizerError(NpucamError):
    """Malformed vocab.json / merges.txt, or text the caller may not tokenize."""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode char map (256 entries)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


# latin-1 decoding maps byte b to chr(b); this table then maps chr(b) to GPT-2's char.
_BYTE_CHARS = {b: c for b, c in bytes_to_unicode().items()}


def _lowercase(text: str) -> str:
    """Per-char lowercase, as Rust's char::to_lowercase (str.lower() adds a final-sigma rule)."""
    if "Σ" in text:
        text = text.replace("Σ", "σ")
    return text.lower()


class Tokenizer:
    """CLIP BPE tokenizer. Build with `from_files(vocab_json, merges_txt)`; reuse for every text."""

    def __init__(
        self,
        vocab: dict[str, int],
        merges: list[tuple[str, str]],
        *,
        context_length: int = CONTEXT_LENGTH,
        source: str = "<memory>",
    ) -> None:
        for name in (BOS_TOKEN, EOS_TOKEN):
            if name not in vocab:
                raise TokenizerError(f"{source}: vocabulary has no {name!r} token")
        if context_length < 2:
            raise TokenizerError(f"{source}: context length {context_length} < 2")
        self.vocab = vocab
        self.ranks = {pair: rank for rank, pair in enumerate(merges)}
        self.bos_id = vocab[BOS_TOKEN]
        self.eos_id = vocab[EOS_TOKEN]
        self.unk_id = self.eos_id
        self.pad_id = self.eos_id
        self.vocab_size = max(vocab.values()) + 1
        self.context_length = context_length
        self._cache: dict[str, tuple[int, ...]] = {}

    @classmethod
    def from_files(
        cls, vocab_json: str | Path, merges_txt: str | Path, *, context_length: int = CONTEXT_LENGTH
    ) -> Tokenizer:
        """Load an HF-layout vocab.json ({token: id}) and merges.txt ("a b" per line by rank)."""
        vocab_path, merges_path = Path(vocab_json), Path(merges_txt)
        try:
            vocab = json.loads(vocab_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TokenizerError(f"{vocab_path}: cannot read vocabulary: {exc}") from None
        if not isinstance(vocab, dict) or not all(
            isinstance(k, str) and isinstance(v, int) for k, v in vocab.items()
        ):
            raise TokenizerError(f"{vocab_path}: expected a JSON object of token -> integer id")
        try:
            lines = merges_path.read_text(encoding="utf-8").split("\n")
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenizerError(f"{merges_path}: cannot read merges: {exc}") from None
        merges: list[tuple[str, str]] = []
        for lineno, line in enumerate(lines, start=1):
            if not line.strip() or line.startswith("#version"):
                continue
            parts = line.split()
            if len(parts) != 2:
                raise TokenizerError(
                    f"{merges_path}:{lineno}: expected two symbols per merge, in: {line!r}"
                )
            merges.append((parts[0], parts[1]))
        return cls(vocab, merges, context_length=context_length, source=str(vocab_path))

    @classmethod
    def from_tokenizer_json(
        cls, tokenizer_json: str | Path, *, context_length: int = CONTEXT_LENGTH
    ) -> Tokenizer:
        """Load the BPE vocabulary and merges of an HF `tokenizers` file (what transformers v5
        saves for CLIPTokenizer); the model must be CLIP's BPE (end_of_word_suffix `</w>`)."""
        path = Path(tokenizer_json)
        try:
            model = json.loads(path.read_text(encoding="utf-8"))["model"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise TokenizerError(f"{path}: cannot read a tokenizers model: {exc}") from None
        if model.get("type") != "BPE" or model.get("end_of_word_suffix") != END_OF_WORD:
            raise TokenizerError(
                f"{path}: model is {model.get('type')!r} with end_of_word_suffix "
                f"{model.get('end_of_word_suffix')!r}, not CLIP's BPE with '</w>'"
            )
        merges: list[tuple[str, str]] = []
        for i, m in enumerate(model.get("merges", [])):
            pair = m.split(" ") if isinstance(m, str) else m
            if not isinstance(pair, list) or len(pair) != 2:
                raise TokenizerError(f"{path}: model.merges[{i}] is not a pair: {m!r}")
            merges.append((pair[0], pair[1]))
        vocab = model.get("vocab")
        if not isinstance(vocab, dict):
            raise TokenizerError(f"{path}: model.vocab is not an object")
        vocab = dict(vocab)
        for name in (BOS_TOKEN, EOS_TOKEN):
            if name not in vocab:
                raise TokenizerError(f"{path}: model.vocab has no {name!r} token")
        return cls(vocab, merges, context_length=context_length, source=str(path))

    @classmethod
    def from_dir(cls, folder: str | Path, *, context_length: int = CONTEXT_LENGTH) -> Tokenizer:
        """vocab.json + merges.txt in `folder` (a bundle root or an HF folder), else its
        tokenizer.json."""
        folder = Path(folder)
        if (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
            return cls.from_files(
                folder / "vocab.json", folder / "merges.txt", context_length=context_length
            )
        if (folder / "tokenizer.json").is_file():
            return cls.from_tokenizer_json(folder / "tokenizer.json", context_length=context_length)
        raise TokenizerError(f"{folder}: no vocab.json + merges.txt and no tokenizer.json")

    def _bpe(self, piece: str) -> tuple[int, ...]:
        """Ids of one pre-tokenized piece (already mapped through bytes_to_unicode)."""
        cached = self._cache.get(piece)
        if cached is not None:
            return cached
        word = [*piece[:-1], piece[-1] + END_OF_WORD]
        ranks = self.ranks
        while len(word) > 1:
            best = None
            best_rank = None
            for pair in zip(word, word[1:], strict=False):
                rank = ranks.get(pair)
                if rank is not None and (best_rank is None or rank < best_rank):
                    best, best_rank = pair, rank
            if best is None:
                break
            first, second = best
            merged: list[str] = []
            i = 0
            n = len(word)
            while i < n:
                if i < n - 1 and word[i] == first and word[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        vocab = self.vocab
        ids = tuple(vocab.get(symbol, self.unk_id) for symbol in word)
        if len(self._cache) < 200_000:
            self._cache[piece] = ids
        return ids

    def _segment_ids(self, text: str, out: list[int]) -> None:
        if not unicodedata.is_normalized("NFC", text):
            text = unicodedata.normalize("NFC", text)
        text = _lowercase(_WHITESPACE.sub(" ", text))
        for piece in _PIECES.findall(text):
            for part in _LOWERED_SPECIALS.get(piece, (piece,)):
                out.extend(self._bpe(part.encode("utf-8").decode("latin-1").translate(_BYTE_CHARS)))

    def tokens(self, text: str) -> list[int]:
        """Token ids of `text` without bos/eos and without truncation."""
        if not isinstance(text, str):
            raise TokenizerError(f"text must be a str, got {type(text).__name__}")
        out: list[int] = []
        if "<|" in text:
            for part in _SPECIALS.split(text):
                if part == BOS_TOKEN:
                    out.append(self.bos_id)
                elif part == EOS_TOKEN:
                    out.append(self.eos_id)
                elif part:
                    self._segment_ids(part, out)
        else:
            self._segment_ids(text, out)
        return out

    def encode(self, text: str) -> list[int]:
        """bos + token ids + eos, truncated to the context length (77), unpadded."""
        return [self.bos_id, *self.tokens(text)[: self.context_length - 2], self.eos_id]

    def encode_prompt(self, text: str, *, what: str = "text") -> list[int]:
        """As `encode`, but a text without any letter is an error naming `what`."""
        if not isinstance(text, str) or not _LETTER.search(text):
            raise TokenizerError(f"{what} {text!r} has no letters to tokenize")
        return self.encode(text)

    def pad_ids(self, ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        """Encoded texts -> (input_ids int64 [n, 77] padded with pad_id, attention mask [n, 77])."""
        n, ctx = len(ids), self.context_length
        out = np.full((n, ctx), self.pad_id, dtype=np.int64)
        mask = np.zeros((n, ctx), dtype=np.int64)
        for row, seq in enumerate(ids):
            if len(seq) > ctx:
                raise TokenizerError(f"text {row}: {len(seq)} ids exceed the context of {ctx}")
            out[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
        return out, mask

    def __call__(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Texts -> (input_ids int64 [n, 77], attention_mask int64 [n, 77]), HF's padding."""
        return self.pad_ids([self.encode(t) for t in texts])
