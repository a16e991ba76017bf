"""A model's vocabulary as the grammar engine (llguidance) sees it: every token's bytes, control
tokens marked so that no text can match them, the end-of-generation tokens (what a finished grammar
allows), and llama.cpp's own tokenizer for the engine to tokenize forced text with. Built once per
loaded model (a pass over the vocabulary: about a second for 150k tokens) and kept with it."""

from __future__ import annotations

import ctypes
import weakref

import llguidance

from edgespec.runtime.llama import Model, lib

_TOKENIZERS: weakref.WeakKeyDictionary[Model, llguidance.LLTokenizer] = weakref.WeakKeyDictionary()
# llguidance reads a token that starts with this byte as a special token, never as text
_SPECIAL = b"\xff"


def grammar_tokenizer(model: Model) -> llguidance.LLTokenizer:
    """The llguidance tokenizer of `model`'s vocabulary (built on first use, then kept)."""
    tok = _TOKENIZERS.get(model)
    if tok is None:
        tok = _TOKENIZERS[model] = _build(model)
    return tok


def _build(model: Model) -> llguidance.LLTokenizer:
    llama = lib()
    vocab = model._vocab
    special = llama.LLAMA_TOKEN_ATTR_CONTROL
    user = llama.LLAMA_TOKEN_ATTR_USER_DEFINED
    buf = ctypes.create_string_buffer(1024)
    pieces: list[bytes] = []
    eog: list[int] = []
    for t in range(model.n_vocab):
        n = llama.llama_token_to_piece(vocab, t, buf, len(buf), 0, True)
        if n < 0:  # a piece longer than the buffer
            big = ctypes.create_string_buffer(-n)
            n = llama.llama_token_to_piece(vocab, t, big, len(big), 0, True)
            piece = big.raw[:n]
        else:
            piece = buf.raw[:n]
        attr = llama.llama_vocab_get_attr(vocab, t)
        # a control token, or a user-defined one written like one (<|im_start|>), is no text
        if attr & special or (attr & user and piece.startswith(b"<") and piece.endswith(b">")):
            piece = _SPECIAL + piece
        pieces.append(piece)
        if llama.llama_vocab_is_eog(vocab, t):
            eog.append(t)
    eos = model.info.eos
    eos_tokens = ([eos] if eos in eog else []) + [t for t in eog if t != eos] or [eos]
    tokenize = ctypes.cast(llama.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
    return llguidance.LLTokenizer.from_llamacpp(tokens=pieces, vocab_ptr=vocab, tokenize_fptr=tokenize,
                                                eos_token=eos_tokens, slices=None)
