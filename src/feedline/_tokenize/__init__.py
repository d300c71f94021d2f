"""The tokenizer layer: load any tokenizer users have, encode in large GIL-free batches."""

from feedline._tokenize.load import load_tokenizer
from feedline._tokenize.tokenizer import Tokenizer

__all__ = ["Tokenizer", "load_tokenizer"]
