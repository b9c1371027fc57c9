"""Content as AES-256-GCM ciphertext, bound to where it is stored.

Format, version 1 (37 bytes of overhead):

    0x01 | leaf (8 bytes: the tenant's data key number) | nonce (12 bytes, random) | ciphertext + tag (16 bytes)

The associated data is the format byte, the leaf and the binding (tenant, table, row, column), each length-prefixed
so that no two bindings encode alike. A ciphertext copied into another row, column or tenant, or with its header
edited, fails to authenticate (`Tampered`). Random 96-bit nonces are safe here because a data key seals little
(one erasure unit: an artifact, a record's value), far below the 2^32 messages per key where they would not be.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from app.keys.errors import Tampered

FORMAT = 1
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
_LEAF = struct.Struct(">Q")
_HEADER = 1 + _LEAF.size + NONCE_BYTES
OVERHEAD = _HEADER + TAG_BYTES


@dataclass(frozen=True, slots=True)
class Binding:
    """Where a ciphertext lives; part of what it authenticates."""

    tenant: str
    table: str
    row: str
    column: str

    def encode(self) -> bytes:
        parts = (self.tenant, self.table, self.row, self.column)
        return b"".join(struct.pack(">I", len(raw)) + raw for raw in (part.encode() for part in parts))


def _aad(leaf: int, binding: Binding) -> bytes:
    return b"lethe-envelope" + bytes([FORMAT]) + _LEAF.pack(leaf) + binding.encode()


def cipher(key: bytes) -> AESGCM:
    """The AEAD of a data key; built once per key and cached (`keyring`), it halves the cost of a small unseal."""
    if len(key) != KEY_BYTES:
        raise ValueError("a data key is 32 bytes (AES-256)")
    return AESGCM(key)


def seal(aead: AESGCM, leaf: int, binding: Binding, plaintext: bytes) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    return bytes([FORMAT]) + _LEAF.pack(leaf) + nonce + aead.encrypt(nonce, plaintext, _aad(leaf, binding))


def leaf(ciphertext: bytes) -> int:
    """The data key a ciphertext names (to derive it before `unseal`)."""
    if len(ciphertext) < OVERHEAD or ciphertext[0] != FORMAT:
        raise Tampered("not a Lethe ciphertext of a known format")
    value: int = _LEAF.unpack_from(ciphertext, 1)[0]
    return value


def unseal(aead: AESGCM, binding: Binding, ciphertext: bytes) -> bytes:
    number = leaf(ciphertext)
    nonce = bytes(ciphertext[1 + _LEAF.size : _HEADER])
    try:
        return aead.decrypt(nonce, bytes(ciphertext[_HEADER:]), _aad(number, binding))
    except InvalidTag:
        raise Tampered("ciphertext does not authenticate for this key and binding") from None
