"""SentencePiece ``.model`` files (BPE with byte fallback, Unigram) against sentencepiece itself, on real prose."""

from __future__ import annotations

import json
import pickle

import pytest
import zstandard

from conftest import shared
from feedline import TokenizerError, load_tokenizer
from feedline._tokenize.spm import read_model
from heavy import lazy, needs

spm = lazy("sentencepiece")

# On one xdist worker (--dist loadgroup otherwise spreads the tests over every worker): the module's
# fixtures, tokenizers and first-use imports are set up once, not once a worker.
pytestmark = [needs("sentencepiece"), pytest.mark.xdist_group("tokenize_spm")]


def _prose() -> list[str]:
    """Botchan lines, 100 C4 documents, the naughty strings as documents and as lines."""
    prose = shared("prose")
    docs = [x for x in (prose / "botchan.txt").read_text(encoding="utf-8").split("\n") if x]
    docs += [json.loads(x)["text"] for x in (prose / "c4_demo.jsonl").read_text(encoding="utf-8").splitlines()[:100]]
    raw = zstandard.ZstdDecompressor().stream_reader((prose / "pile" / "lm_dataformat_blns.jsonl.zst").open("rb")).read()
    blns = [t for t in (json.loads(x)["text"] for x in raw.decode().splitlines()) if isinstance(t, str)]
    return docs + blns + blns[0].split("\n")


def _pair(rel: str) -> tuple[object, object, str]:
    path = str(shared("tokenizers", rel))
    return load_tokenizer(path), spm.SentencePieceProcessor(model_file=path), path


@pytest.mark.slow
def test_bpe_model_with_byte_fallback_encodes_like_sentencepiece() -> None:
    tok, sp, _ = _pair("mistral-v3/tokenizer.model")
    assert tok.encode("Hello world, naïve café!").tolist() == [23325, 2294, 29493, 2647, 29688, 1101, 29113, 29576]
    texts = _prose()
    ref = sp.encode(texts)
    got = [x.tolist() for x in tok.encode_batch(texts)]
    assert sum(map(len, ref)) > 100_000
    assert [i for i, (a, b) in enumerate(zip(ref, got, strict=True)) if a != b] == []
    assert any(sp.id_to_piece(i).startswith("<0x") for ids in ref for i in ids)  # byte fallback was exercised


@pytest.mark.slow
def test_unigram_model_encodes_like_sentencepiece_up_to_lattice_ties() -> None:
    tok, sp, _ = _pair("t5/spiece.model")
    scores = [s for _, s, _ in read_model(shared("tokenizers", "t5", "spiece.model").read_bytes()).pieces]
    texts = _prose()
    ref = sp.encode(texts)
    got = [x.tolist() for x in tok.encode_batch(texts)]
    differ = [i for i, (a, b) in enumerate(zip(ref, got, strict=True)) if a != b]
    assert len(differ) <= 1  # "Hotta......." : '......' '.' vs '.' '......'
    for i in differ:  # a difference is only ever a tie: same pieces' total score, same surface text
        assert sum(scores[j] for j in ref[i]) == pytest.approx(sum(scores[j] for j in got[i]), abs=1e-9)
        assert "".join(sp.id_to_piece(ref[i])) == "".join(tok.id_to_token(j) for j in got[i])


def test_model_roles_and_explicit_bos_eos() -> None:
    mistral, sp, _ = _pair("mistral-v3/tokenizer.model")
    text = "The cat walks in the park."
    assert mistral.specials["bos"] == 1 and mistral.eos_id == 2 and mistral.specials["pad"] is None
    assert mistral.pad_id == 2  # no pad piece: padding falls back to eos
    assert mistral.encode(text, add_special_tokens=True).tolist() == sp.encode(text, add_bos=True)
    t5 = load_tokenizer(str(shared("tokenizers", "t5", "spiece.model")))
    t5_json = load_tokenizer(str(shared("tokenizers", "t5")))
    assert t5.bos_id is None and t5.eos_id == 1 and t5.pad_id == 0
    assert t5.encode(text, add_special_tokens=True).tolist() == t5_json.encode(text, add_special_tokens=True).tolist()
    assert t5.encode(text, add_special_tokens=True).tolist()[-1] == 1  # T5 frames with </s> at the end


def test_control_pieces_are_special_tokens_in_text() -> None:
    """The documented difference: ``<s>``/``[INST]`` in text are their ids (as in the official tokenizer.json)."""
    tok, sp, _ = _pair("mistral-v3/tokenizer.model")
    ids = tok.encode("<s>[INST] Hi [/INST]").tolist()
    assert ids[:2] == [1, 3] and ids[-1] == 4
    assert 1 not in sp.encode("<s>[INST] Hi [/INST]")  # sentencepiece reads the characters
    assert set(tok.all_special_ids.tolist()) >= {0, 1, 2, 3, 4}


@pytest.mark.slow
def test_proto_reader_agrees_with_the_protobuf_schema() -> None:
    pb2 = pytest.importorskip("sentencepiece.sentencepiece_model_pb2")
    for rel in ("mistral-v3/tokenizer.model", "t5/spiece.model"):
        data = shared("tokenizers", rel).read_bytes()
        ours, ref = read_model(data), pb2.ModelProto()
        ref.ParseFromString(data)
        assert ours.pieces == [(p.piece, pytest.approx(p.score), p.type) for p in ref.pieces]
        ts, ns = ref.trainer_spec, ref.normalizer_spec
        assert (ours.model_type, ours.byte_fallback, ours.unk_id, ours.bos_id, ours.eos_id, ours.pad_id) == (
            ts.model_type, ts.byte_fallback, ts.unk_id, ts.bos_id, ts.eos_id, ts.pad_id)
        assert (ours.normalizer, ours.precompiled_charsmap, ours.add_dummy_prefix, ours.remove_extra_whitespaces,
                ours.escape_whitespaces) == (ns.name, ns.precompiled_charsmap, ns.add_dummy_prefix,
                                             ns.remove_extra_whitespaces, ns.escape_whitespaces)


@pytest.mark.slow
def test_converted_tokenizer_pickles_and_decodes() -> None:
    tok, sp, _ = _pair("mistral-v3/tokenizer.model")
    text = "Héllo  wörld 🤖 \t tabs"
    again = pickle.loads(pickle.dumps(tok))  # how a tokenizer travels to Ray workers
    assert again.encode(text).tolist() == tok.encode(text).tolist() == sp.encode(text)
    assert tok.decode(tok.encode(text)) == sp.decode(sp.encode(text)) == text


def test_unreadable_model_is_a_clear_error(tmp_path) -> None:
    bad = tmp_path / "tokenizer.model"
    bad.write_bytes(b"\xff\xff\xff not a model")
    with pytest.raises(TokenizerError, match=r"tokenizer.model: not a readable SentencePiece model"):
        load_tokenizer(str(bad))
