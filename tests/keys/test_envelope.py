"""The envelope: a ciphertext opens only under its key and where it was stored; everything else is `Tampered`."""

from __future__ import annotations

import dataclasses
import os

import pytest

from app.keys import envelope
from app.keys.envelope import Binding
from app.keys.errors import Tampered

KEY = envelope.cipher(os.urandom(32))
HERE = Binding("ten_a", "artifacts", "art_1", "text")


def test_round_trip_and_leaf() -> None:
    sealed = envelope.seal(KEY, 4097, HERE, b"passport X1234567")
    assert envelope.leaf(sealed) == 4097
    assert b"X1234567" not in sealed
    assert len(sealed) == len(b"passport X1234567") + envelope.OVERHEAD
    assert envelope.unseal(KEY, HERE, sealed) == b"passport X1234567"


@pytest.mark.parametrize("field", ["tenant", "table", "row", "column"])
def test_moved_ciphertext_fails(field: str) -> None:
    sealed = envelope.seal(KEY, 7, HERE, b"secret")
    elsewhere = dataclasses.replace(HERE, **{field: getattr(HERE, field) + "x"})
    with pytest.raises(Tampered):
        envelope.unseal(KEY, elsewhere, sealed)


def test_binding_fields_cannot_slide() -> None:
    """("ab", "c") and ("a", "bc") are different places: the fields are length-prefixed."""
    sealed = envelope.seal(KEY, 7, Binding("t", "ab", "c", "x"), b"secret")
    with pytest.raises(Tampered):
        envelope.unseal(KEY, Binding("t", "a", "bc", "x"), sealed)


@pytest.mark.parametrize("offset", [1, 8, 9, 20, -1])  # the leaf, the nonce, the ciphertext, the tag
def test_edited_byte_fails(offset: int) -> None:
    sealed = bytearray(envelope.seal(KEY, 7, HERE, b"secret"))
    sealed[offset] ^= 0x01
    with pytest.raises(Tampered):
        envelope.unseal(KEY, HERE, bytes(sealed))


def test_a_data_key_is_256_bits() -> None:
    with pytest.raises(ValueError):
        envelope.cipher(os.urandom(16))


def test_wrong_key_truncated_and_unknown_format_fail() -> None:
    sealed = envelope.seal(KEY, 7, HERE, b"secret")
    with pytest.raises(Tampered):
        envelope.unseal(envelope.cipher(os.urandom(32)), HERE, sealed)
    with pytest.raises(Tampered):
        envelope.unseal(KEY, HERE, sealed[: envelope.OVERHEAD - 1])
    with pytest.raises(Tampered):
        envelope.unseal(KEY, HERE, b"\x02" + sealed[1:])
