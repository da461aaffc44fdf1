"""An incremental parser of server-sent events (the ``text/event-stream`` format).

Bytes go in as they arrive, in any chunking — an event split across reads, several events
in one read, a line ending ``\\r\\n`` split between two reads — and complete events come
out. Lines end with ``\\n`` or ``\\r\\n`` (a lone ``\\r`` is not a line end here).
Comment lines (``: keep-alive``) and fields other than ``data`` are skipped; the ``data``
lines of one event are joined with newlines, as the format says.
"""

from __future__ import annotations

from collections.abc import Iterator


class SSEParser:
    def __init__(self) -> None:
        self._buf = bytearray()
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> Iterator[str]:
        """The data of each event that ``chunk`` completes, in order."""
        self._buf += chunk
        while True:
            line = self._next_line()
            if line is None:
                return
            if line == "":
                if self._data:
                    data, self._data = "\n".join(self._data), []
                    yield data
                continue
            field, _, value = line.partition(":")
            if field == "data":
                self._data.append(value[1:] if value.startswith(" ") else value)
            # a comment (empty field name) or event/id/retry: nothing to do

    def _next_line(self) -> str | None:
        i = self._buf.find(b"\n")
        if i < 0:
            return None
        line = bytes(self._buf[:i]).removesuffix(b"\r")
        del self._buf[: i + 1]
        return line.decode("utf-8", errors="replace")

    def close(self) -> Iterator[str]:
        """The last event, when the stream ended without its blank line."""
        if self._buf:
            yield from self.feed(b"\n")
        if self._data:
            data, self._data = "\n".join(self._data), []
            yield data
