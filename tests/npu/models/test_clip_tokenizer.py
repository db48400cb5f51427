"""npu.models.clip Tokenizer against HF CLIPTokenizer (transformers 5.23.0) on the same files."""

from __future__ import annotations

import random
import unicodedata

import pytest
from conftest_clip import clip_vocab_dir  # noqa: F401 (fixture)

from npu.models.clip.tokenizer import Tokenizer, TokenizerError

_WORD_TEXT = (
    "a photo of the cat dog person wearing hard hat holding phone bicycle kitchen laptop pizza "
    "running jumping New York über naïve café résumé Ångström façade jalapeño "
    "smörgåsbord ÉCOLE STRASSE straße İstanbul ΣΟΦΙΑ ΟΔΟΣ Ελλάδα Москва привет "
    "東京 北京市 こんにちは 안녕하세요 مرحبا שלום नमस्ते สวัสดี ქართული Ṁùļṭî "
    "x² ½ ⅓ Ⅻ ٣ ١٢٣ ５ ６７ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ﬁne ﬀ Ǆ ǅ ǆ ß ẞ ŉ"
)
WORDS = _WORD_TEXT.split()
PUNCT = list("!?.,;:'\"`~@#$%^&*()[]{}<>/\\|-_=+…—–«»“”‘’¿¡·•§¶")
EMOJI = [
    "😀",
    "👍🏽",
    "👨‍👩‍👧‍👦",
    "🇫🇷",
    "❤️",
    "🐱",
    "🚲",
    "🍕",
    "✌🏿",
    "🏳️‍🌈",
    "☃",
    "⚽",
    "🤖",
]
CONTRACTIONS = [
    "don't",
    "it's",
    "we'll",
    "I'M",
    "they've",
    "she'd",
    "you're",
    "'S",
    "O'Neil",
    "rock'n'roll",
    "''s",
    "'''",
    "a!'s",
    "l'été",
    "can't",
    "'ll'",
    "s'",
    "'d'd",
]
SPACES = [
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "\u00a0",
    "\u2003",
    "\u3000",
    "\u200b",
    "\x0b",
    "\x0c",
    "\x1c",
    "\x1f",
    "\x85",
    "\u2028",
    "\u180e",
    "\ufeff",
    "   \t\n ",
]
DIGITS = ["0", "7", "42", "1234567890", "3.14159", "1,000,000", "2nd", "v1.2.3", "٣٤", "１２"]
SPECIAL = ["<|endoftext|>", "<|startoftext|>", "<|ENDOFTEXT|>", "<|StartOfText|>", "<|end", "|>"]
DECOMPOSED = ["e\u0301", "A\u030a", "n\u0303o", "\u1100\u1161", "o\u0308\u0304", "\u0915\u093f"]


def _assigned_chars() -> list[str]:
    """Code points assigned in Unicode 14.0 (Python 3.11's unicodedata), except surrogates.

    Code points assigned later can differ: HF's regex tables and the `regex` package's are of
    different Unicode versions (docs/clip.md).
    """
    return [
        chr(c) for c in range(0x20, 0x30000) if unicodedata.category(chr(c)) not in ("Cn", "Cs")
    ]


def corpus(n_random: int = 2400, seed: int = 0) -> list[str]:
    """Fixed cases plus random mixes: unicode, emoji, digits, apostrophes, long texts."""
    rng = random.Random(seed)
    chars = _assigned_chars()
    pools = [WORDS, PUNCT, EMOJI, CONTRACTIONS, SPACES, DIGITS, SPECIAL, DECOMPOSED]
    fixed = [
        "",
        " ",
        "a",
        "A photo of a cat.",
        "a photo of a  {}",
        "x " * 100,
        "supercalifragilisticexpialidocious " * 30,
        "1" * 200,
        "!!!???",
        "😀" * 90,
    ]
    fixed += WORDS + PUNCT + EMOJI + CONTRACTIONS + SPACES + DIGITS + SPECIAL + DECOMPOSED
    texts = list(fixed)
    for i in range(n_random):
        kind = i % 4
        if kind == 0:  # words and symbols with spaces
            parts = [rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 25))]
            texts.append("".join(p + rng.choice(["", " ", " ", "  ", "\t"]) for p in parts))
        elif kind == 1:  # raw random assigned code points
            texts.append("".join(rng.choice(chars) for _ in range(rng.randint(1, 40))))
        elif kind == 2:  # long prose over the 77-token context
            texts.append(" ".join(rng.choice(WORDS + CONTRACTIONS + DIGITS) for _ in range(120)))
        else:  # dense mixes without spaces
            texts.append("".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(2, 15))))
    return texts


@pytest.fixture(scope="module")
def hf_tokenizer(clip_vocab_dir):  # noqa: F811
    from transformers import CLIPTokenizer

    return CLIPTokenizer.from_pretrained(str(clip_vocab_dir))


@pytest.fixture(scope="module")
def tokenizer(clip_vocab_dir) -> Tokenizer:  # noqa: F811
    return Tokenizer.from_files(clip_vocab_dir / "vocab.json", clip_vocab_dir / "merges.txt")


def test_ids_equal_hf_on_2000_strings(tokenizer, hf_tokenizer):
    texts = corpus()
    assert len(texts) >= 2000
    expected = hf_tokenizer(texts, truncation=True, max_length=77)["input_ids"]
    mismatches = [
        (t, e, tokenizer.encode(t))
        for t, e in zip(texts, expected, strict=True)
        if tokenizer.encode(t) != e
    ]
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[0]!r}"
    # the corpus really covers truncation and the specials
    assert sum(len(e) == 77 for e in expected) > 300
    assert any(tokenizer.eos_id in e[1:-1] for e in expected)


def test_padded_ids_and_mask_equal_hf_max_length_padding(tokenizer, hf_tokenizer):
    texts = ["a photo of a cat", "", "x " * 100, "don't stop 1234"]
    ref = hf_tokenizer(texts, truncation=True, max_length=77, padding="max_length")
    ids, mask = tokenizer(texts)
    assert ids.shape == (4, 77)
    assert ids.tolist() == ref["input_ids"]
    assert mask.tolist() == ref["attention_mask"]


def test_encode_is_bos_tokens_eos_truncated_to_77_unpadded(tokenizer):
    short = tokenizer.encode("a cat")
    assert short[0] == 49406 and short[-1] == 49407 and len(short) == 4
    long = tokenizer.encode("cat " * 200)
    assert len(long) == 77 and long[0] == 49406 and long[-1] == 49407
    assert long[1:-1] == tokenizer.tokens("cat " * 200)[:75]


def test_known_ids_of_a_prompt(tokenizer):
    # open_clip's published ids for this prompt (bos, a, photo, of, a, cat, eos)
    assert tokenizer.encode("a photo of a cat") == [49406, 320, 1125, 539, 320, 2368, 49407]


def test_symbols_missing_from_the_vocabulary_become_the_unknown_token_as_hf(tmp_path):
    import json

    from transformers import CLIPTokenizer

    vocab = {
        "a</w>": 0,
        "b": 1,
        "a": 2,
        "b</w>": 3,
        "ab</w>": 4,
        "<|startoftext|>": 5,
        "<|endoftext|>": 6,
    }
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b</w>\n")
    tok = Tokenizer.from_files(tmp_path / "vocab.json", tmp_path / "merges.txt")
    hf = CLIPTokenizer.from_pretrained(str(tmp_path))
    texts = ["ba c", "ab", "cab", "bab b!", "zz"]
    assert [tok.encode(t) for t in texts] == hf(texts)["input_ids"]
    assert tok.encode("ba c") == [5, 1, 0, 6, 6]


def test_text_without_letters_is_an_error_for_prompts(tokenizer):
    with pytest.raises(TokenizerError, match="no letters"):
        tokenizer.encode_prompt("1234 !!", what="label 0")
    assert tokenizer.encode_prompt("a cat") == tokenizer.encode("a cat")


def test_malformed_files_name_the_file_and_line(tmp_path, clip_vocab_dir):  # noqa: F811
    bad_merges = tmp_path / "merges.txt"
    bad_merges.write_text("#version: 0.2\na b\nc d e\n")
    with pytest.raises(TokenizerError, match=r"merges.txt:3: expected two symbols"):
        Tokenizer.from_files(clip_vocab_dir / "vocab.json", bad_merges)
    with pytest.raises(TokenizerError, match="missing.json"):
        Tokenizer.from_files(tmp_path / "missing.json", clip_vocab_dir / "merges.txt")
    no_specials = tmp_path / "vocab.json"
    no_specials.write_text('{"a</w>": 0}')
    with pytest.raises(TokenizerError, match="<\\|startoftext\\|>"):
        Tokenizer.from_files(no_specials, clip_vocab_dir / "merges.txt")


@pytest.mark.slow
def test_every_assigned_code_point_alone_and_in_words_equals_hf(tokenizer, hf_tokenizer):
    texts = ["a" + c + "b " + c + c + " " + c.upper() for c in _assigned_chars()]
    expected = hf_tokenizer(texts, truncation=True, max_length=77)["input_ids"]
    bad = [t for t, e in zip(texts, expected, strict=True) if tokenizer.encode(t) != e]
    assert not bad, f"{len(bad)} code points differ, first {bad[:5]!r}"


def test_tokenizer_json_saved_by_transformers_v5_gives_the_same_ids(
    tokenizer, hf_tokenizer, tmp_path
):
    hf_tokenizer.save_pretrained(str(tmp_path))
    assert not (tmp_path / "vocab.json").exists()  # v5 writes tokenizer.json only
    from_json = Tokenizer.from_dir(tmp_path)
    texts = corpus(n_random=200, seed=3)
    assert [from_json.encode(t) for t in texts] == [tokenizer.encode(t) for t in texts]
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "WordPiece"}}')
    with pytest.raises(TokenizerError, match="not CLIP's BPE"):
        Tokenizer.from_dir(tmp_path)
    with pytest.raises(TokenizerError, match="no vocab.json"):
        Tokenizer.from_dir(tmp_path / "nowhere")
