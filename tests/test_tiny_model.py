"""scripts/make_tiny_model.py writes a GGUF file llama.cpp can load: read back with GGUFReader."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import gguf
import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "make_tiny_model.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_tiny_model", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


tiny = load_script()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    path = tiny.write_model(tmp_path_factory.mktemp("model") / "tiny.gguf", seed=3)
    yield gguf.GGUFReader(path)


def value(reader: Any, key: str) -> Any:
    return reader.fields[key].contents()


def test_metadata_is_what_llama_cpp_reads(model: Any) -> None:
    """The llama hyperparameters and the tokenizer keys are there, with the config's values."""
    config = tiny.TinyConfig()
    assert value(model, "general.architecture") == "llama"
    assert value(model, "llama.block_count") == config.block_count
    assert value(model, "llama.embedding_length") == config.embedding_length
    assert value(model, "llama.feed_forward_length") == config.feed_forward_length
    assert value(model, "llama.attention.head_count") == config.head_count
    assert value(model, "llama.attention.head_count_kv") == config.head_count_kv
    assert value(model, "llama.context_length") == config.context_length
    assert value(model, "llama.rope.dimension_count") == config.embedding_length // 4
    assert value(model, "llama.attention.layer_norm_rms_epsilon") == pytest.approx(1e-5)
    assert value(model, "tokenizer.ggml.model") == "llama"
    tokens = value(model, "tokenizer.ggml.tokens")
    assert value(model, "llama.vocab_size") == len(tokens)
    assert len(value(model, "tokenizer.ggml.scores")) == len(tokens)
    assert len(value(model, "tokenizer.ggml.token_type")) == len(tokens)
    assert tokens[value(model, "tokenizer.ggml.bos_token_id")] == "<s>"
    assert tokens[value(model, "tokenizer.ggml.eos_token_id")] == "</s>"
    assert tokens[value(model, "tokenizer.ggml.unknown_token_id")] == "<unk>"
    assert value(model, "tokenizer.chat_template") == tiny.CHAT_TEMPLATE


def test_vocabulary_covers_any_text(model: Any) -> None:
    """Tokens are unique (llama.cpp asserts it), all 256 byte-fallback tokens are there, the
    ChatML markers are control tokens, and every word piece is reachable through prefixes."""
    tokens = value(model, "tokenizer.ggml.tokens")
    kinds = value(model, "tokenizer.ggml.token_type")
    assert len(set(tokens)) == len(tokens)
    byte_tokens = [t for t, k in zip(tokens, kinds, strict=True) if k == gguf.TokenType.BYTE]
    assert byte_tokens == [f"<0x{b:02X}>" for b in range(256)]
    control = {t for t, k in zip(tokens, kinds, strict=True) if k == gguf.TokenType.CONTROL}
    assert {"<|im_start|>", "<|im_end|>", "<s>", "</s>"} <= control
    for marker in ("<|im_start|>", "<|im_end|>"):
        assert marker in tiny.CHAT_TEMPLATE
    normal = {t for t, k in zip(tokens, kinds, strict=True) if k == gguf.TokenType.NORMAL}
    assert set("abcXYZ019.,!?") | {tiny.SPACE} <= normal
    for word in tiny.WORDS:
        spelled = tiny.SPACE + word
        assert all(spelled[:end] in normal for end in range(2, len(spelled) + 1)), word


def test_tensors_have_llama_names_and_shapes(model: Any) -> None:
    """Each tensor llama.cpp's llama loader requires, F32, in ggml's (columns, rows) order."""
    config = tiny.TinyConfig()
    n_embd, n_ff = config.embedding_length, config.feed_forward_length
    n_vocab = len(value(model, "tokenizer.ggml.tokens"))
    n_kv = n_embd // config.head_count * config.head_count_kv
    expected = {
        "token_embd.weight": [n_embd, n_vocab],
        "output_norm.weight": [n_embd],
        "output.weight": [n_embd, n_vocab],
    }
    for b in range(config.block_count):
        expected |= {
            f"blk.{b}.attn_norm.weight": [n_embd],
            f"blk.{b}.attn_q.weight": [n_embd, n_embd],
            f"blk.{b}.attn_k.weight": [n_embd, n_kv],
            f"blk.{b}.attn_v.weight": [n_embd, n_kv],
            f"blk.{b}.attn_output.weight": [n_embd, n_embd],
            f"blk.{b}.ffn_norm.weight": [n_embd],
            f"blk.{b}.ffn_gate.weight": [n_embd, n_ff],
            f"blk.{b}.ffn_up.weight": [n_embd, n_ff],
            f"blk.{b}.ffn_down.weight": [n_ff, n_embd],
        }
    got = {t.name: [int(n) for n in t.shape] for t in model.tensors}
    assert got == expected
    assert {t.tensor_type for t in model.tensors} == {gguf.GGMLQuantizationType.F32}
    assert all(np.isfinite(t.data).all() for t in model.tensors)


def test_output_head_prefers_word_pieces(model: Any) -> None:
    """On the residual path (embedding, final norm, output head) every token's most likely
    successor is a normal word piece, by a wide margin over byte, control and end tokens."""
    tensors = {t.name: np.asarray(t.data) for t in model.tensors}
    kinds = np.asarray(value(model, "tokenizer.ggml.token_type"))
    hidden = tensors["token_embd.weight"]
    normed = hidden / np.sqrt((hidden**2).mean(axis=1, keepdims=True) + 1e-5)
    logits = normed @ tensors["output.weight"].T
    normal = kinds == gguf.TokenType.NORMAL
    assert normal[logits.argmax(axis=1)].all()
    margin = logits[:, normal].max(axis=1) - logits[:, ~normal].max(axis=1)
    assert margin.min() > 8


def test_seed_decides_the_weights(tmp_path: Path) -> None:
    """The same seed writes the same bytes; another seed other weights."""
    a = tiny.write_model(tmp_path / "a.gguf", seed=1).read_bytes()
    b = tiny.write_model(tmp_path / "b.gguf", seed=1).read_bytes()
    c = tiny.write_model(tmp_path / "c.gguf", seed=2).read_bytes()
    assert a == b
    assert a != c and len(a) == len(c)


def test_write_replaces_atomically(tmp_path: Path) -> None:
    """An existing file is replaced whole and no temporary file is left beside it."""
    target = tmp_path / "tiny.gguf"
    target.write_bytes(b"old")
    tiny.write_model(target, config=tiny.TinyConfig(block_count=1))
    assert value(gguf.GGUFReader(target), "llama.block_count") == 1
    assert [p.name for p in tmp_path.iterdir()] == ["tiny.gguf"]


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ({"block_count": 0}, "at least 1"),
        ({"embedding_length": 66}, "must divide"),
        ({"head_count": 4, "head_count_kv": 3}, "must divide"),
        ({"embedding_length": 12, "head_count": 4, "head_count_kv": 1}, "must be even"),
        ({"context_length": 8}, "context_length"),
    ],
)
def test_bad_sizes_are_refused_before_writing(
    tmp_path: Path, config: dict[str, int], problem: str
) -> None:
    """Sizes llama.cpp would refuse raise ValueError naming the problem; nothing is written."""
    with pytest.raises(ValueError, match=problem):
        tiny.write_model(tmp_path / "x.gguf", config=tiny.TinyConfig(**config))
    assert list(tmp_path.iterdir()) == []


def test_command_line(tmp_path: Path) -> None:
    """The script writes the file and says so; a missing folder is one line and exit 2."""
    ok = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "m.gguf"), "--layers", "1"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(f"wrote {tmp_path / 'm.gguf'} (")
    assert value(gguf.GGUFReader(tmp_path / "m.gguf"), "llama.block_count") == 1
    bad = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "nowhere" / "m.gguf")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2
    assert bad.stderr == f"make_tiny_model: no such folder: {tmp_path / 'nowhere'}\n"
    assert not (tmp_path / "nowhere").exists()
