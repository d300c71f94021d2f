"""``feedline train-tokenizer``: train a BPE, WordPiece or Unigram tokenizer from text files or word counts.

``--format tokenizers`` (default) writes ``tokenizer.json``; ``--format sentencepiece`` writes a
SentencePiece ``.model`` + ``.vocab`` (unigram or bpe; see docs/tokenizers.md for which to use).
"""

from __future__ import annotations

import argparse

from feedline._cli._common import add_progress_argument, setup_progress
from feedline.errors import SpecError

NAME = "train-tokenizer"
HELP = "train a tokenizer (bpe: GPT, wordpiece: BERT, unigram: T5) from text/JSONL files or word<TAB>count TSV"
EXAMPLE = ("feedline train-tokenizer corpus/*.jsonl.zst -o tok/ --kind wordpiece --vocab-size 30522\n"
           "  feedline train-tokenizer counts.tsv -o spm/ --format sentencepiece --kind unigram --vocab-size 32000")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_progress_argument(p)
    p.add_argument("inputs", nargs="+", help="files, globs or directories (any source format), or .tsv word counts")
    p.add_argument("-o", "--output", required=True,
                   help="output directory (tokenizer.json, or the .model + .vocab, and tokenizer_config.json)")
    p.add_argument("--format", choices=["tokenizers", "sentencepiece"], default="tokenizers",
                   help="trainer and output: tokenizers (tokenizer.json) or sentencepiece (.model + .vocab; "
                        "unigram or bpe) (default: tokenizers)")
    p.add_argument("--tokenizer-json", action="store_true",
                   help="with --format sentencepiece: also write a converted tokenizer.json (unigram)")
    p.add_argument("--kind", choices=["bpe", "wordpiece", "unigram"], default="bpe", help="model family (default: bpe)")
    p.add_argument("--vocab-size", type=int, default=32000, help="vocabulary size, special tokens included")
    p.add_argument("--min-frequency", type=int, default=2, help="minimum frequency of a merge (bpe, wordpiece)")
    p.add_argument("--lowercase", action=argparse.BooleanOptionalAction, default=None, help="lower-case text first")
    p.add_argument("--sentinels", type=int, default=None, help="<extra_id_N> tokens (unigram; default 100)")
    p.add_argument("--text", default="text", help="text field of JSONL inputs (default: text)")


def run(args: argparse.Namespace) -> int:
    setup_progress(args)
    if args.format == "sentencepiece":
        from feedline._tools.train_sentencepiece import train_sentencepiece

        if args.kind == "wordpiece":
            raise SpecError("sentencepiece trains unigram or bpe; use --format tokenizers for wordpiece")
        model = train_sentencepiece(args.inputs, args.output, kind=args.kind, vocab_size=args.vocab_size,
                                    lowercase=bool(args.lowercase), sentinels=args.sentinels, text_field=args.text,
                                    tokenizer_json=args.tokenizer_json)
        from feedline._tools.train_sentencepiece import piece_count

        got = piece_count(model)
        short = "" if got >= args.vocab_size else f"; only {got} of the {args.vocab_size} asked: the corpus is too small"
        print(f"wrote {model} and {model.with_suffix('.vocab')} ({args.kind}, sentencepiece, {got} pieces{short})")
        return 0
    if args.tokenizer_json:
        raise SpecError("--tokenizer-json is for --format sentencepiece (the tokenizers format is tokenizer.json)")
    from feedline._tools.train_tokenizer import train_tokenizer

    tok = train_tokenizer(args.inputs, args.output, kind=args.kind, vocab_size=args.vocab_size,
                          min_frequency=args.min_frequency, lowercase=args.lowercase,
                          sentinels=args.sentinels, text_field=args.text)
    print(f"wrote {args.output}/tokenizer.json ({args.kind}, {tok.vocab_size} tokens)")
    return 0
