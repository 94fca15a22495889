"""ttrpc client: many concurrent calls on one connection (adaptor.ttrpc.streams keeps the
stream rules)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl as ssl_module
from collections.abc import Sequence

from google.protobuf.message import DecodeError

from .codec import encode_request
from .connection import READ_CHUNK, close_writer, open_tcp, open_unix
from .gen import ttrpc_pb2
from .status import Code, TtrpcError
from .streams import ClientStreams

_Result = tuple[Code, str, bytes]


class Client:
    """A ttrpc connection for unary calls; `call` raises TtrpcError for any non-OK outcome."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._streams = ClientStreams()
        self._pending: dict[int, asyncio.Future[_Result]] = {}
        self._error: TtrpcError | None = None
        self._read_task = asyncio.get_running_loop().create_task(
            self._read_loop(), name="ttrpc-client-read"
        )

    @classmethod
    async def connect_unix(cls, path: str) -> Client:
        """Connect to a ttrpc server on a unix socket (UNAVAILABLE if nobody listens)."""
        reader, writer = await open_unix(path)
        return cls(reader, writer)

    @classmethod
    async def connect_tcp(
        cls, host: str, port: int, *, ssl: ssl_module.SSLContext | None = None
    ) -> Client:
        """Connect to a ttrpc server over TCP, with TLS when `ssl` is given."""
        reader, writer = await open_tcp(host, port, ssl)
        return cls(reader, writer)

    @property
    def closed(self) -> bool:
        """True once the connection is gone; every later call raises UNAVAILABLE."""
        return self._error is not None

    async def call(
        self,
        service: str,
        method: str,
        payload: bytes,
        *,
        metadata: Sequence[tuple[str, str]] = (),
        timeout_nano: int = 0,
    ) -> bytes:
        """One unary call; `timeout_nano` > 0 is sent to the server and bounds the wait here."""
        if self._error is not None:
            raise self._error
        data = encode_request(service, method, payload, timeout_nano, metadata)
        stream_id = self._streams.call(data)
        future: asyncio.Future[_Result] = asyncio.get_running_loop().create_future()
        self._pending[stream_id] = future
        try:
            self._writer.write(self._streams.data_to_send())
            await self._writer.drain()
            if timeout_nano > 0:
                deadline = asyncio.timeout(timeout_nano / 1e9)
                try:
                    async with deadline:
                        code, message, body = await future
                except TimeoutError:
                    if not deadline.expired():
                        raise
                    raise TtrpcError(Code.DEADLINE_EXCEEDED, "context deadline exceeded") from None
            else:
                code, message, body = await future
        except (ConnectionError, OSError) as exc:
            raise TtrpcError(Code.UNAVAILABLE, f"connection lost: {exc}") from exc
        finally:
            self._pending.pop(stream_id, None)
            self._streams.forget(stream_id)
        if code != Code.OK:
            raise TtrpcError(code, message)
        return body

    async def _read_loop(self) -> None:
        streams = self._streams
        why = "connection closed"
        try:
            while True:
                data = await self._reader.read(READ_CHUNK)
                if not data:
                    break
                for answer in streams.receive(data):
                    future = self._pending.get(answer.stream_id)
                    if future is not None and not future.done():
                        future.set_result(_parse_response(answer.data))
        except (ConnectionError, OSError) as exc:
            why = f"connection lost: {exc}"
        finally:
            self._fail_all(TtrpcError(Code.UNAVAILABLE, why))

    def _fail_all(self, error: TtrpcError) -> None:
        if self._error is None:
            self._error = error
        for future in self._pending.values():
            if not future.done():
                future.set_exception(self._error)
        self._pending.clear()

    async def close(self) -> None:
        """Close the connection; pending calls get UNAVAILABLE."""
        self._fail_all(TtrpcError(Code.UNAVAILABLE, "client closed"))
        self._read_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._read_task
        await close_writer(self._writer)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def _parse_response(data: bytes) -> _Result:
    try:
        response = ttrpc_pb2.Response.FromString(data)
    except DecodeError as exc:
        return (Code.INTERNAL, f"malformed response: {exc}", b"")
    status = response.status
    return (Code.from_wire(status.code), status.message, response.payload)
