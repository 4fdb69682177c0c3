"""CRC32C of a concatenation from its pieces' CRC32Cs and lengths (stdlib only).

A composite object's CRC32C is computed by the server from its parts; checking it
against the parts' own CRC32Cs needs the CRC of ``A + B`` from ``crc(A)``, ``crc(B)``
and ``len(B)``.  CRCs are linear over GF(2): appending ``n`` zero bytes to ``A`` is a
32x32 bit-matrix power applied to ``crc(A)`` (O(log n) matrix squarings, no bytes
touched), and the result XOR ``crc(B)`` is ``crc(A + B)``.
"""

from __future__ import annotations

from collections.abc import Iterable

#: The Castagnoli polynomial, bit-reversed (CRC32C as GCS and iSCSI define it).
_POLY = 0x82F63B78


def _times(matrix: list[int], vector: int) -> int:
    total, i = 0, 0
    while vector:
        if vector & 1:
            total ^= matrix[i]
        vector >>= 1
        i += 1
    return total


def _square(matrix: list[int]) -> list[int]:
    return [_times(matrix, row) for row in matrix]


def _zero_bytes_operator(n: int) -> list[int]:
    """The matrix that advances a CRC register over ``n`` zero bytes."""
    one_bit = [_POLY] + [1 << i for i in range(31)]  # one zero bit
    op = _square(_square(_square(one_bit)))  # one zero byte (8 bits)
    result = [1 << i for i in range(32)]  # identity
    while n:
        if n & 1:
            result = [_times(op, row) for row in result]
        n >>= 1
        if n:
            op = _square(op)
    return result


def crc32c_combine(pieces: Iterable[tuple[int, int]]) -> int:
    """CRC32C of the pieces concatenated, from ``(crc32c, length)`` of each in order."""
    crc = 0
    for piece_crc, length in pieces:
        if length:
            crc = _times(_zero_bytes_operator(length), crc) ^ piece_crc
    return crc
