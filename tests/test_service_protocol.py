"""Wire-format, bind-policy and stream-loading units of the loader service (no sockets)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from feedline._service.auth import check_bind, is_loopback
from feedline._service.metrics import render_prometheus
from feedline._service.protocol import (
    decode_batch,
    encode_batch,
    encode_batches,
    error_from_header,
    pack,
    pack_state,
    split_batches,
    unpack_header,
    unpack_state,
)
from feedline._service.streams import load_streams, parse_stream_option
from feedline.errors import ProtocolError, SpecError


def test_batch_round_trip_is_exact_and_zero_copy() -> None:
    batch = {"input_ids": np.arange(12, dtype=np.int32).reshape(3, 4), "flag": np.array([True, False, True]),
             "w": np.linspace(0, 1, 3), "cols": np.arange(12, dtype=np.int16).reshape(3, 4)[:, ::2],
             "empty": np.zeros((0, 5), dtype=np.int64)}
    header, payload = encode_batch(batch, step=7, state='{"step": 7}')
    h = unpack_header(header)
    assert h["op"] == "batch" and h["step"] == 7 and h["state"] == '{"step": 7}'
    out = decode_batch(h, [memoryview(payload)])
    assert list(out) == list(batch)
    for k in batch:
        assert out[k].dtype == batch[k].dtype and out[k].shape == batch[k].shape and np.array_equal(out[k], batch[k])
        assert out[k].ctypes.data % out[k].dtype.itemsize == 0   # aligned views (the float64 follows 3 bools)
    assert np.shares_memory(out["w"], np.frombuffer(payload, dtype=np.uint8))


@pytest.mark.parametrize("fields,buf,match", [
    ([["x", "|O", [1], 0]], b"\0" * 8, "not a plain numeric"),
    ([["x", "<i4", [3], 0]], b"\0" * 8, "do not fit"),
    ([["x", "<i4", [1], 2]], b"\0" * 8, "aligned to 4"),
    ([["x", "<i4", [2], 0], ["y", "<i4", [1], 4]], b"\0" * 12, "malformed field"),   # overlapping
    ([["x", "<i4", [-1], 0]], b"", "malformed field"),
    ([["x", "<i4", [1]]], b"\0" * 4, "malformed field"),    # version 1's field list, without offsets
    ([["x", "nonsense", [1], 0]], b"\0", "unknown dtype"),
    ([["x", "<i4", [1], 0]], b"\0" * 16, "no field describes"),
    ([], b"\0", "no field describes"),
])
def test_decode_refuses_what_it_cannot_check(fields: list, buf: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_batch({"op": "batch", "fields": fields}, [buf])


def test_decode_refuses_one_frame_per_array() -> None:
    """Protocol version 1 sent a frame per array: a clear error, never arrays cut from the wrong bytes."""
    with pytest.raises(ProtocolError, match="one payload frame.*version 1"):
        decode_batch({"op": "batch", "fields": [["x", "<i4", [1], 0], ["y", "<i4", [1], 4]]}, [b"\0" * 4, b"\0" * 4])


def test_several_steps_in_one_message_decode_as_their_own_batches() -> None:
    """``batches``: one header and one payload for several steps, each item its own aligned bytes."""
    steps = [({"input_ids": np.arange(5, dtype=np.int32) + s, "flag": np.ones(3, bool)[: s + 1]}, s, f'{{"step": {s}}}')
             for s in (1, 2, 3)]
    header, payload = encode_batches(steps)
    h = unpack_header(header)
    assert h["op"] == "batches" and [item["step"] for item in h["items"]] == [1, 2, 3]
    got = split_batches(h, payload)
    for (batch, step, state), (item, buf) in zip(steps, got, strict=True):
        assert item["state"] == state and item["at"][0] % 8 == 0
        _one_header, one_payload = encode_batch(batch, step=step, state=state)
        assert bytes(buf) == one_payload   # each item's bytes are the single-step message's payload
        out = decode_batch(item, [buf])
        assert all(np.array_equal(out[k], batch[k]) for k in batch)
        assert np.shares_memory(out["input_ids"], np.frombuffer(payload, dtype=np.uint8))


@pytest.mark.parametrize("items,size,match", [
    ([], 0, "lists 0 items"),
    ([{"at": [0, 8]}] * 1025, 8, "lists 1025 items"),
    (["x"], 8, "item 0"),
    ([{"at": [0, 16]}], 8, "item 0"),                       # beyond the payload
    ([{"at": [0, 8]}, {"at": [4, 4]}], 8, "item 1"),         # overlapping
    ([{"at": [0, 4]}, {"at": [12, 4]}], 16, "item 1"),       # a gap beyond the alignment
    ([{"at": [0, 4]}, {"at": [5, 3]}], 8, "item 1"),         # not aligned
    ([{"at": [0, -1]}], 8, "item 0"),
    ([{"at": [True, 8]}], 8, "item 0"),
    ([{"at": [0, 8]}], 16, "no item describes"),
])
def test_split_refuses_items_that_do_not_tile_the_payload(items: list, size: int, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        split_batches({"op": "batches", "items": items}, b"\0" * size)


@pytest.mark.parametrize("state", [
    {"version": 1, "step": 3, "pipeline": {"pos": [1, 2.5, True, None], "names": ("a", "b"), "text": "é\u2028"}},
    {"step": 1, "by_index": {0: "zero", 7: [1, 2]}},             # integer keys: JSON makes them strings
    {"step": 1, "huge": 2**70, "neg": -(2**65)},                 # beyond msgpack: travels as JSON
])
def test_a_state_crosses_the_wire_as_its_json_would(state: dict) -> None:
    raw = pack_state(state)
    assert isinstance(raw, str if "huge" in state else bytes)
    header, _payload = encode_batch({"x": np.zeros(2, np.int8)}, step=1, state=raw)
    assert unpack_state(unpack_header(header)["state"]) == json.loads(json.dumps(state))


@pytest.mark.parametrize("raw", [b"\xc1", b"\x93\x01\x02\x03", "[1, 2]", "{oops"])
def test_a_state_that_does_not_decode_to_a_map_is_a_protocol_error(raw: bytes | str) -> None:
    with pytest.raises(ProtocolError, match="batch state"):
        unpack_state(raw)


@pytest.mark.parametrize("frame", [b"", b"\xc1", b"\x93\x01\x02\x03", pack("x")[:-1], b"\x81\x01\x02"])
def test_garbage_headers_raise_protocol_error(frame: bytes) -> None:
    with pytest.raises(ProtocolError):
        unpack_header(frame)


def test_error_messages_map_to_typed_errors_only_from_a_whitelist() -> None:
    assert type(error_from_header({"kind": "StateError", "message": "m"})).__name__ == "StateError"
    assert type(error_from_header({"kind": "os.system", "message": "m"})).__name__ == "TransportError"


def test_bind_policy() -> None:
    assert is_loopback("tcp://127.0.0.1:1") and is_loopback("tcp://[::1]:1") and is_loopback("tcp://localhost:1")
    assert not is_loopback("tcp://0.0.0.0:1") and not is_loopback("tcp://*:1") and not is_loopback("tcp://10.0.0.1:1")
    check_bind("tcp://0.0.0.0:1", None, insecure=True)
    with pytest.raises(SpecError, match="--insecure"):
        check_bind("tcp://*:5555", None, insecure=False)
    with pytest.raises(SpecError, match="must start with"):
        check_bind("udp://127.0.0.1:1", None, insecure=False)


def test_named_streams_inherit_and_override(tmp_path) -> None:
    (tmp_path / "val.yaml").write_text("sources: [v.txt]\nbatching: {batch_size: 2}\n")
    main = {"sources": ["a.txt"], "batching": {"batch_size": 4}, "task": {"kind": "clm", "max_length": 16},
            "streams": {"heldout": {"sources": ["h.txt"], "epochs": 2}}}
    streams = load_streams(main, {"validation": str(tmp_path / "val.yaml")})
    assert list(streams) == ["train", "heldout", "validation"]
    held = streams["heldout"].spec
    assert held.epochs == 2 and held.batching.batch_size == 4 and held.task.options.max_length == 16
    assert streams["validation"].spec.batching.batch_size == 2
    assert streams["train"].spec.hash() != held.hash()
    with pytest.raises(SpecError, match="streams.heldout"):
        load_streams({**main, "streams": {"heldout": {"epochz": 1}}})
    with pytest.raises(SpecError, match="main spec is the 'train' stream"):
        load_streams({**main, "streams": {"train": {}}})
    assert parse_stream_option("validation=val.yaml") == ("validation", "val.yaml")
    with pytest.raises(SpecError, match="NAME=SPEC"):
        parse_stream_option("val.yaml")


def test_prometheus_rendering() -> None:
    text = render_prometheus({"streams": {"train": {"batches": 3, "rejected": {"bad_json": 2}, "mixture": [0.5, 0.5],
                                                     "spec_hash": "abc"}},
                              "clients": [{"id": "ab", "stream": "train", "rank": 1, "credit": 2, "lag": 0}]})
    assert 'feedline_batches_total{stream="train"} 3.0' in text
    assert 'feedline_rejected_records_total{reason="bad_json",stream="train"} 2.0' in text
    assert 'feedline_client_credit{client="ab",rank="1",stream="train"} 2.0' in text
    assert "spec_hash" not in text


def test_plain_and_compact_batches_share_one_field_bound() -> None:
    """One ``MAX_FIELDS`` (the batching layer's), which the protocol's decoder imports: a plain batch of
    that many fields decodes, one more is refused naming the bound, and so is a compact layout listing more."""
    from feedline._batching.compact import MAX_FIELDS, CompactBatch
    from feedline._service import protocol

    assert protocol.MAX_FIELDS is MAX_FIELDS
    batch = {f"f{i}": np.full(2, i, np.int16) for i in range(MAX_FIELDS)}
    header, payload = encode_batch(batch, step=1, state="{}")
    assert len(decode_batch(unpack_header(header), [payload])) == MAX_FIELDS
    header, payload = encode_batch({**batch, "one_more": np.zeros(2, np.int16)}, step=1, state="{}")
    with pytest.raises(ProtocolError, match=f"{MAX_FIELDS + 1} fields \\(at most {MAX_FIELDS}\\)"):
        decode_batch(unpack_header(header), [payload])
    layout = {"max_length": 4, "max_docs": 2, "attention": "padding", "mask_first": False, "pad": {},
              "fields": [[f"f{i}", "input_ids"] for i in range(MAX_FIELDS + 1)]}
    with pytest.raises(ProtocolError, match="malformed compact batch layout"):
        CompactBatch.from_wire(layout, {})


@pytest.mark.parametrize("batching,length,docs", [
    ({"strategy": "pack", "batch_size": 4}, 64, 64),
    ({"strategy": "concat", "batch_size": 4, "max_length": 32, "max_docs_per_row": 5}, 32, 5),
    ({"strategy": "pad", "batch_size": 4, "pad_to": "max_length", "pad_to_multiple_of": 24}, 72, None),
    ({"strategy": "pad", "batch_size": 4}, None, None),
])
def test_welcome_limits_take_the_row_length_as_the_batchers_do(batching: dict, length: int | None,
                                                              docs: int | None) -> None:
    """``stream_limits`` asks the batchers' own ``row_length``: the same length, and the same refusal of a
    fixed-length strategy without one, for a server's welcome and for a client given the spec."""
    from feedline._service.client import RemoteLoader
    from feedline._service.trust import stream_limits
    from feedline._spec import Spec

    spec = {"sources": ["a.txt"], "task": {"kind": "clm", "max_length": 64}, "batching": batching}
    assert stream_limits(Spec.from_mapping(spec)) == {"rows": 4, "max_length": length, "max_docs": docs}
    unbounded = {**spec, "task": {"kind": "clm", "max_length": None}}
    if length is None:
        assert stream_limits(Spec.from_mapping(unbounded))["max_length"] is None
        return
    with pytest.raises(SpecError, match=f"strategy '{batching['strategy']}' needs a row length: set batching.max_length"):
        stream_limits(Spec.from_mapping({**unbounded, "batching": {**batching, "max_length": None}}))
    with pytest.raises(SpecError, match="needs a row length"):   # before any connection, not an unbounded client
        RemoteLoader("tcp://127.0.0.1:9", spec={**unbounded, "batching": {**batching, "max_length": None}})
