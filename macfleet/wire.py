"""Signed msgpack messages: the one framing used by the control and the data plane.

A message is ``[mac, header, *payload]``: ``mac`` is HMAC-SHA256 of the header under the job
secret, ``header`` a small msgpack map, payload frames raw bytes. The mac is checked before
the header is unpacked, and the header is unpacked with limits, so garbage, oversized or
forged frames cost a hash and are dropped. Payload integrity rests on TCP; the header
(which carries sizes and sequence numbers) is what the mac protects. Never pickle.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import msgpack

VERSION = 1
MAC_BYTES = 32
MAX_HEADER_BYTES = 16 * 1024


class BadMessage(Exception):
    """A frame that is not a well-formed, authenticated message of this job. Dropped, never fatal."""


def sign(secret: bytes, header: bytes) -> bytes:
    return hmac.new(secret, header, hashlib.sha256).digest()


def pack(secret: bytes, fields: dict[str, Any]) -> tuple[bytes, bytes]:
    """Return ``(mac, header)`` for the given fields (``v`` is added)."""
    header = msgpack.packb({"v": VERSION, **fields}, use_bin_type=True)
    return sign(secret, header), header


def unpack(secret: bytes, mac: bytes | memoryview, header: bytes | memoryview) -> dict[str, Any]:
    """Check and decode a header; raise ``BadMessage`` for anything not ours."""
    if len(mac) != MAC_BYTES or not 0 < len(header) <= MAX_HEADER_BYTES:
        raise BadMessage("bad frame sizes")
    header = bytes(header)
    if not hmac.compare_digest(sign(secret, header), bytes(mac)):
        raise BadMessage("bad mac")
    try:
        fields = msgpack.unpackb(
            header, raw=False, strict_map_key=True, use_list=False,
            max_array_len=4096, max_map_len=256,
        )
    except Exception as exc:  # msgpack raises several unrelated types for garbage
        raise BadMessage(f"undecodable header: {type(exc).__name__}") from None
    if not isinstance(fields, dict) or fields.get("v") != VERSION:
        raise BadMessage("wrong version or not a map")
    return fields
