"""``feedline train-tokenizer``: train a BPE, WordPiece or Unigram tokenizer from text files or word counts."""

from __future__ import annotations

import argparse

NAME = "train-tokenizer"
HELP = "train a tokenizer (bpe: GPT, wordpiece: BERT, unigram: T5) from text/JSONL files or word<TAB>count TSV"
EXAMPLE = "feedline train-tokenizer corpus/*.jsonl.zst -o tok/ --kind wordpiece --vocab-size 30522"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", help="files, globs or directories (any source format), or .tsv word counts")
    p.add_argument("-o", "--output", required=True, help="output directory (tokenizer.json + tokenizer_config.json)")
    p.add_argument("--kind", choices=["bpe", "wordpiece", "unigram"], default="bpe", help="model family (default: bpe)")
    p.add_argument("--vocab-size", type=int, default=32000, help="vocabulary size, special tokens included")
    p.add_argument("--min-frequency", type=int, default=2, help="minimum frequency of a merge (bpe, wordpiece)")
    p.add_argument("--lowercase", action=argparse.BooleanOptionalAction, default=None, help="lower-case text first")
    p.add_argument("--sentinels", type=int, default=None, help="<extra_id_N> tokens (unigram; default 100)")
    p.add_argument("--text", default="text", help="text field of JSONL inputs (default: text)")


def run(args: argparse.Namespace) -> int:
    from feedline.tools.train_tokenizer import train_tokenizer

    tok = train_tokenizer(args.inputs, args.output, kind=args.kind, vocab_size=args.vocab_size,
                          min_frequency=args.min_frequency, lowercase=args.lowercase,
                          sentinels=args.sentinels, text_field=args.text)
    print(f"wrote {args.output}/tokenizer.json ({args.kind}, {tok.vocab_size} tokens)")
    return 0
