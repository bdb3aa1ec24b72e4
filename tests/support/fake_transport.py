"""What the unit tests' fake servers share as a client transport (txlog.transport.Transport)."""

from __future__ import annotations


class UnaryFetch:
    """``fetch`` for a fake whose ``call`` answers Fetch: a FetchStream answered in
    one chunk, the Fetch's response (a stream may hold one; the real chunks are
    tested through the real services, tests/integ/test_fetch_stream.py)."""

    async def fetch(self, address, request, *, timeout_ms=None):
        yield await self.call(address, "Fetch", request, timeout_ms=timeout_ms)
