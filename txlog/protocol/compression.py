"""Compression of record batches (RecordBatch.compression, compressed_records).

A compressed batch holds, in ``compressed_records``, the codec's output of a
serialized RecordBatch that holds only ``records``; its records carry no
offsets (record i is base_offset + i) and a record with timestamp 0 takes the
batch's ``log_append_time_ms``. The producer compresses, the leader checks the
records decompressed and stores the batch compressed, and a reader either
takes it as stored (a codec it listed in FetchRequest.accepted_compressions)
or gets it decompressed by the leader (:func:`expand`), exactly as an
uncompressed batch.

Guarantees: decompression never produces more than the ``bytes_max`` its
caller names (the server's batch_bytes_max on produce): a small input that
would inflate past it (a "compression bomb") is refused with
:class:`CompressionError` before more than ``bytes_max + 1`` bytes exist, as is
input the codec cannot read whole (truncated, trailing bytes, garbage).
"""

from __future__ import annotations

import zlib

import lz4.frame
import zstandard
from google.protobuf.message import DecodeError

from txlog.v1 import common_pb2

NONE = common_pb2.COMPRESSION_NONE
GZIP = common_pb2.COMPRESSION_GZIP
ZSTD = common_pb2.COMPRESSION_ZSTD
LZ4 = common_pb2.COMPRESSION_LZ4

# Kafka's names (the producer's compression.type).
CODEC_BY_NAME = {"none": NONE, "gzip": GZIP, "zstd": ZSTD, "lz4": LZ4}
NAME_BY_CODEC = {codec: name for name, codec in CODEC_BY_NAME.items()}
CODECS = frozenset((GZIP, ZSTD, LZ4))  # every codec this module reads and writes
# What readers of stored batches (the leader expanding one, a consumer) let one
# decompress to: the leader checked each against its batch_bytes_max (16 MiB by
# default) when it was produced; this bound only stops a damaged one.
READ_BYTES_MAX = 1 << 30
GZIP_WBITS = 31  # zlib's gzip container (RFC 1952)
ZSTD_LEVEL = 3  # zstd's default level, Kafka's too


class CompressionError(ValueError):
    """Bytes that do not decompress within the limit: say which and why."""


def codec_named(name: str) -> int:
    """The codec of a Kafka compression.type name; ValueError naming the choices."""
    try:
        return CODEC_BY_NAME[name]
    except (KeyError, TypeError):
        raise ValueError(f"compression type must be one of {', '.join(CODEC_BY_NAME)}, not {str(name)[:100]!r}") from None


def compress(codec: int, data: bytes) -> bytes:
    if codec == GZIP:
        compressor = zlib.compressobj(wbits=GZIP_WBITS)
        return compressor.compress(data) + compressor.flush()
    if codec == ZSTD:
        return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data)
    if codec == LZ4:
        return lz4.frame.compress(data)
    raise ValueError(f"unknown compression codec {codec}")


def decompress(codec: int, data: bytes, bytes_max: int) -> bytes:
    """``data`` decompressed, at most ``bytes_max`` bytes, or CompressionError."""
    name = NAME_BY_CODEC.get(codec, str(codec))
    try:
        if codec == GZIP:
            decompressor = zlib.decompressobj(wbits=GZIP_WBITS)
            out = decompressor.decompress(data, bytes_max + 1)
            whole, unused = decompressor.eof, decompressor.unused_data
        elif codec == ZSTD:
            # The frame's declared size is checked first (zstd allocates it); without one, max_output_size bounds
            # the output, and a frame that needs more fails as "did not decompress full frame", like a truncated
            # one. Bytes after the first frame are ignored (zstd's decompress() does not report them).
            declared = zstandard.get_frame_parameters(bytes(data)).content_size
            if declared != zstandard.CONTENTSIZE_UNKNOWN and declared > bytes_max:
                raise CompressionError(f"compressed_records (zstd) declare {declared} bytes, more than the limit of {bytes_max}")
            out = zstandard.ZstdDecompressor().decompress(bytes(data), max_output_size=bytes_max)
            whole, unused = True, b""
        elif codec == LZ4:
            decompressor = lz4.frame.LZ4FrameDecompressor()
            out = decompressor.decompress(bytes(data), max_length=bytes_max + 1)
            whole, unused = decompressor.eof, decompressor.unused_data
        else:
            raise CompressionError(f"unknown compression codec {codec}")
    except (zlib.error, zstandard.ZstdError, RuntimeError) as exc:  # lz4 raises RuntimeError
        raise CompressionError(f"compressed_records are not valid {name} within the limit of {bytes_max} bytes "
                               f"(truncated, corrupt or larger): {exc}") from None
    if len(out) > bytes_max:
        raise CompressionError(f"compressed_records ({name}) decompress to more than the limit of {bytes_max} bytes")
    if not whole:
        raise CompressionError(f"compressed_records are not one whole {name} stream (truncated)")
    if unused:
        raise CompressionError(f"compressed_records ({name}) have {len(unused)} bytes after the end of the stream")
    return out


def compress_records(codec: int, records) -> bytes:
    """``records`` as a batch's compressed_records: a RecordBatch of only them, compressed."""
    return compress(codec, common_pb2.RecordBatch(records=records).SerializeToString())


def records_only(raw, error: type[ValueError], what: str) -> common_pb2.RecordBatch:
    """``raw`` parsed as a RecordBatch that holds only ``records`` (how batches
    carry their records, compressed or encoded), or ``error`` saying that ``what`` is not one."""
    try:
        inner = common_pb2.RecordBatch.FromString(raw)
    except DecodeError as exc:
        raise error(f"{what} are not a serialized RecordBatch: {exc}") from None
    others = [field.name for field, _ in inner.ListFields() if field.name != "records"]
    if others:
        raise error(f"{what} must hold a RecordBatch of only records, not {', '.join(others)}")
    return inner


def open_records(batch: common_pb2.RecordBatch, bytes_max: int) -> common_pb2.RecordBatch:
    """The RecordBatch (records only, at least one) inside a compressed batch,
    or CompressionError."""
    raw = decompress(batch.compression, batch.compressed_records, bytes_max)
    inner = records_only(raw, CompressionError, "compressed_records decompressed")
    if not inner.records:
        raise CompressionError("compressed_records hold no records")
    return inner


def expand(batch: common_pb2.RecordBatch, bytes_max: int, from_offset: int = 0) -> None:
    """Turns a compressed batch, in place, into the uncompressed batch it
    stands for: its records in ``records`` with their offsets (base_offset + i)
    and timestamps (0 takes log_append_time_ms), those below ``from_offset``
    left out. An uncompressed batch is left as it is."""
    if batch.compression == NONE:
        return
    inner = open_records(batch, bytes_max)
    base_offset, append_time_ms = batch.base_offset, batch.log_append_time_ms
    skip = max(from_offset - base_offset, 0)
    records = inner.records
    if skip:
        del records[:skip]
    for index, record in enumerate(records, base_offset + skip):
        record.offset = index
        if not record.timestamp_ms:
            record.timestamp_ms = append_time_ms
    for name in ("compression", "compressed_records", "log_append_time_ms"):
        batch.ClearField(name)
    batch.records.MergeFrom(records)
