#!/usr/bin/env python3
"""Write a tiny random-weight llama GGUF model, so a real llama.cpp server can be tested here.

    python scripts/make_tiny_model.py tiny.gguf             # about 0.6 MB, in well under a second
    python scripts/make_tiny_model.py tiny.gguf --seed 7    # other weights, other replies

No download: every byte is made here with the ``gguf`` package (a dev dependency). The model is
what llama.cpp loads as ``general.architecture = llama``: 2 blocks of RMS norm, grouped-query
attention with RoPE and a SwiGLU feed-forward, an untied output head, all F32. Its tokenizer is
a SentencePiece-style one (``tokenizer.ggml.model = llama``): ``<unk>``, ``<s>``, ``</s>``, the
256 byte-fallback tokens ``<0x00>``..``<0xFF>`` (so any text tokenizes), the ChatML markers as
control tokens, then printable ASCII and a few hundred word pieces, each word reachable by the
tokenizer's merges through its prefixes. A ChatML chat template is in the metadata, so a server
formats chat requests from the model file alone.

The weights are random but arranged so that replies are visible text: every token embedding
carries a large constant on one axis that the output head reads as "plain word piece: yes",
so byte, control and end-of-sequence tokens are (practically) never sampled and a reply runs
to ``max_tokens`` (finish reason ``length``). Replies are nonsense; check structure, not content.
Exits 2 with one line on bad usage (a folder that does not exist, a size out of range).
"""

from __future__ import annotations

import argparse
import os
import string
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

ARCH = "llama"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""ChatML, the template most small chat models ship; its markers are control tokens here."""

SPACE = "\u2581"  # SentencePiece's visible space: llama.cpp writes " " as this before matching
WORDS = (
    "the of and to in is it you that he was for on are with as his they be at one have this "
    "from or had by hot word but what some we can out other were all there when up use your "
    "how said an each she which do their time if will way about many then them write would "
    "like so these her long make thing see him two has look more day could go come did number "
    "sound no most people my over know water than call first who may down side been now find "
    "hello terrarium fork branch summary session model token turn reply stream"
).split()

UNK, BOS, EOS = 0, 1, 2
_SPECIALS = (("<unk>", gguf.TokenType.UNKNOWN), ("<s>", gguf.TokenType.CONTROL))
_EOS_TEXT = "</s>"
_CHATML = ("<|im_start|>", "<|im_end|>")


@dataclass(frozen=True, slots=True)
class TinyConfig:
    """The model's hyperparameters (the ``llama.*`` keys of the file)."""

    embedding_length: int = 64
    """Width of the residual stream (``n_embd``)."""
    block_count: int = 2
    """Transformer blocks (``n_layer``)."""
    head_count: int = 4
    """Attention heads; the head size is ``embedding_length / head_count``."""
    head_count_kv: int = 2
    """Key/value heads (grouped-query attention: 2 query heads share each)."""
    feed_forward_length: int = 128
    """Width of the SwiGLU feed-forward."""
    context_length: int = 2048
    """Context the model was "trained" for; a server may use less (``--n_ctx``)."""
    rms_eps: float = 1e-5
    """Epsilon of the RMS norms."""

    def check(self) -> None:
        """Raise ValueError naming the first size llama.cpp would refuse."""
        if self.block_count < 1 or self.head_count < 1 or self.head_count_kv < 1:
            raise ValueError("block_count, head_count and head_count_kv must be at least 1")
        if self.embedding_length % self.head_count or self.head_count % self.head_count_kv:
            raise ValueError(
                "embedding_length must divide by head_count, and head_count by head_count_kv"
            )
        if (self.embedding_length // self.head_count) % 2:
            raise ValueError("the head size (embedding_length / head_count) must be even (RoPE)")
        if self.feed_forward_length < 1 or self.context_length < 16:
            raise ValueError("feed_forward_length must be at least 1, context_length at least 16")


@dataclass(frozen=True, slots=True)
class Token:
    """One vocabulary entry."""

    text: str
    """The piece as the tokenizer matches it (``▁`` for a leading space)."""
    score: float
    """Merge priority: of two possible merges, the higher-scoring piece wins."""
    kind: gguf.TokenType
    """Normal, control, byte, unknown."""


def vocabulary() -> list[Token]:
    """The tokenizer's entries, in id order: specials, bytes, ChatML markers, then pieces.

    Every word of :data:`WORDS` is reachable from its characters through merges of its
    prefixes (``▁t``, ``▁th``, ``▁the``), longer pieces scoring higher, as SentencePiece's
    merge-by-score tokenizer needs.
    """
    tokens = [Token(text, 0.0, kind) for text, kind in _SPECIALS]
    tokens.append(Token(_EOS_TEXT, 0.0, gguf.TokenType.CONTROL))
    tokens += [Token(f"<0x{b:02X}>", 0.0, gguf.TokenType.BYTE) for b in range(256)]
    tokens += [Token(marker, 0.0, gguf.TokenType.CONTROL) for marker in _CHATML]
    pieces: dict[str, None] = dict.fromkeys([SPACE, *string.printable.strip()])
    for word in WORDS:
        spelled = SPACE + word
        for end in range(2, len(spelled) + 1):
            pieces.setdefault(spelled[:end])
    tokens += [Token(p, float(len(p)), gguf.TokenType.NORMAL) for p in pieces]
    return tokens


def weights(config: TinyConfig, vocab: Sequence[Token], seed: int) -> dict[str, np.ndarray]:
    """Every tensor by its GGUF name, shaped as numpy sees it (rows, columns).

    Axis 0 of the residual stream is a "visible text" flag: each embedding has +8 there, far
    above the small random rest (so it survives the RMS norms and the blocks' small outputs),
    and the output head scores it +1 for normal tokens and -1 for the rest. After the final
    norm that axis is about sqrt(n_embd), so the others lose by ~16 logits.
    """
    rng = np.random.default_rng(seed)
    n_embd, n_ff = config.embedding_length, config.feed_forward_length
    head = n_embd // config.head_count
    n_kv = head * config.head_count_kv

    def random(*shape: int, std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    normal = np.array([t.kind == gguf.TokenType.NORMAL for t in vocab])
    embedding = random(len(vocab), n_embd, std=0.5)
    embedding[:, 0] = 8.0
    output = random(len(vocab), n_embd, std=1.0)
    output[:, 0] = np.where(normal, 1.0, -1.0)
    names = gguf.TENSOR_NAMES
    tensors = {
        names[gguf.MODEL_TENSOR.TOKEN_EMBD] + ".weight": embedding,
        names[gguf.MODEL_TENSOR.OUTPUT_NORM] + ".weight": ones(n_embd),
        names[gguf.MODEL_TENSOR.OUTPUT] + ".weight": output,
    }
    for block in range(config.block_count):
        shapes = {
            gguf.MODEL_TENSOR.ATTN_NORM: None,
            gguf.MODEL_TENSOR.ATTN_Q: (n_embd, n_embd),
            gguf.MODEL_TENSOR.ATTN_K: (n_kv, n_embd),
            gguf.MODEL_TENSOR.ATTN_V: (n_kv, n_embd),
            gguf.MODEL_TENSOR.ATTN_OUT: (n_embd, n_embd),
            gguf.MODEL_TENSOR.FFN_NORM: None,
            gguf.MODEL_TENSOR.FFN_GATE: (n_ff, n_embd),
            gguf.MODEL_TENSOR.FFN_UP: (n_ff, n_embd),
            gguf.MODEL_TENSOR.FFN_DOWN: (n_embd, n_ff),
        }
        for kind, shape in shapes.items():
            name = names[kind].format(bid=block) + ".weight"
            tensors[name] = ones(n_embd) if shape is None else random(*shape)
    return tensors


def write_model(path: str | Path, *, seed: int = 0, config: TinyConfig | None = None) -> Path:
    """Write the model to ``path`` (replaced atomically: never left half-written).

    Returns:
        The path written.

    Raises:
        ValueError: ``config`` has sizes llama.cpp would refuse.
        FileNotFoundError: ``path``'s folder does not exist.
    """
    config = config or TinyConfig()
    config.check()
    target = Path(path)
    if not target.parent.is_dir():
        raise FileNotFoundError(f"no such folder: {target.parent}")
    vocab = vocabulary()
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(temp, ARCH)
        _write_metadata(writer, config, vocab)
        for name, tensor in weights(config, vocab, seed).items():
            writer.add_tensor(name, tensor)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return target


def _write_metadata(writer: gguf.GGUFWriter, config: TinyConfig, vocab: Sequence[Token]) -> None:
    """The ``general.*``, ``llama.*`` and ``tokenizer.ggml.*`` keys llama.cpp reads."""
    writer.add_name("terrarium tiny random llama")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(config.context_length)
    writer.add_embedding_length(config.embedding_length)
    writer.add_block_count(config.block_count)
    writer.add_feed_forward_length(config.feed_forward_length)
    writer.add_head_count(config.head_count)
    writer.add_head_count_kv(config.head_count_kv)
    writer.add_layer_norm_rms_eps(config.rms_eps)
    writer.add_rope_dimension_count(config.embedding_length // config.head_count)
    writer.add_vocab_size(len(vocab))
    writer.add_tokenizer_model("llama")
    writer.add_token_list([t.text for t in vocab])
    writer.add_token_scores([t.score for t in vocab])
    writer.add_token_types([int(t.kind) for t in vocab])
    writer.add_unk_token_id(UNK)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, write the model, return the exit code."""
    defaults = TinyConfig()
    parser = argparse.ArgumentParser(description="Write a tiny random-weight llama GGUF model.")
    parser.add_argument("output", type=Path, help="the .gguf file to write (replaced if it exists)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the weights")
    parser.add_argument("--layers", type=int, default=defaults.block_count, help="blocks")
    parser.add_argument(
        "--context-length", type=int, default=defaults.context_length, help="trained context"
    )
    args = parser.parse_args(argv)
    config = TinyConfig(block_count=args.layers, context_length=args.context_length)
    try:
        path = write_model(args.output, seed=args.seed, config=config)
    except (ValueError, FileNotFoundError) as exc:
        print(f"make_tiny_model: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path} ({path.stat().st_size} bytes, {len(vocabulary())} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
