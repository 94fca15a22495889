"""The EC2 Price List offer file read as a stream, one product or one SKU's terms at a time.

A regional offer file is hundreds of MB (us-east-1's about 450 MB, most of it Reserved terms), and
`json.loads` of it takes several GB, more than `catalog refresh`'s CronJob may use. This walks the
document's outer objects (`products`, `terms`, `terms.OnDemand`) member by member and decodes
only their small members (one product, one SKU's on-demand terms) with the standard JSON decoder;
the terms of other kinds (Reserved) are walked the same way and dropped. NaN and Infinity are
refused as in every other price page; a member larger than MAX_MEMBER_BYTES, nesting too deep or
malformed JSON is a ValueError naming where it stopped.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_MEMBER_BYTES", "OfferRead", "read_offer"]

# the largest single member decoded at once (a product is about 1 KB, a SKU's terms a few KB)
MAX_MEMBER_BYTES = 64 << 20
_SPACE = re.compile(r"[ \t\n\r]*")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


class _Reader:
    """JSON text arriving in chunks: whitespace, one punctuation mark, or one whole value."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._json = json.JSONDecoder(parse_constant=_no_constant)
        self._text = ""
        self._pos = 0
        self._eof = False
        self.consumed = 0  # characters before the buffer (for error positions)

    def _more(self) -> None:
        """Append the next chunk (dropping what was read already)."""
        self.consumed += self._pos
        self._text, self._pos = self._text[self._pos :], 0
        for chunk in self._chunks:
            if chunk:
                self._text += self._utf8.decode(chunk)
                return
        self._text += self._utf8.decode(b"", final=True)
        self._eof = True

    def where(self) -> str:
        return f"at character {self.consumed + self._pos}"

    def peek(self) -> str:
        """The next character that is not whitespace ('' at the end)."""
        while True:
            self._pos = _SPACE.match(self._text, self._pos).end()  # type: ignore[union-attr]
            if self._pos < len(self._text):
                return self._text[self._pos]
            if self._eof:
                return ""
            self._more()

    def take(self, mark: str) -> None:
        if self.peek() != mark:
            raise ValueError(f"expected {mark!r} {self.where()}")
        self._pos += 1

    def value(self) -> Any:
        """The whole JSON value starting here."""
        self.peek()
        while True:
            try:
                value, end = self._json.raw_decode(self._text, self._pos)
            except json.JSONDecodeError as exc:
                if self._eof:
                    raise ValueError(f"not JSON {self.where()}: {exc.msg}") from None
                if len(self._text) - self._pos > MAX_MEMBER_BYTES:
                    too_big = f"a value over {MAX_MEMBER_BYTES} characters {self.where()}"
                    raise ValueError(too_big) from None
                self._more()
                continue
            if end == len(self._text) and not self._eof:  # a number may go on in the next chunk
                self._more()
                continue
            self._pos = end
            return value

    def members(self) -> Iterator[str]:
        """The keys of the object starting here; the caller reads or skips each value in turn."""
        self.take("{")
        if self.peek() == "}":
            self._pos += 1
            return
        while True:
            key = self.value()
            if not isinstance(key, str):
                raise ValueError(f"an object key is not a string {self.where()}")
            self.take(":")
            yield key
            mark = self.peek()
            self._pos += 1
            if mark == "}":
                return
            if mark != ",":
                raise ValueError(f"expected ',' or '}}' {self.where()}")

    def skip(self) -> None:
        """Pass over the value starting here, an object member by member."""
        if self.peek() == "{":
            for _ in self.members():
                self.skip()
        else:
            self.value()

    def end(self) -> None:
        if self.peek():
            raise ValueError(f"text after the document {self.where()}")


@dataclass
class OfferRead:
    """What the offer file gave: the instance type of each product kept, the on-demand terms of
    those products, how many products there were, and which sections were objects."""

    names: dict[str, str] = field(default_factory=dict)  # SKU -> instance type
    on_demand: dict[str, Any] = field(default_factory=dict)  # SKU -> its terms (raw JSON)
    products: int = 0
    has_products: bool = False
    has_on_demand: bool = False


def read_offer(chunks: Iterable[bytes], product: Callable[[str, Any], str | None]) -> OfferRead:
    """Walk an offer file: `product(sku, raw)` names the instance type of a product to keep (or
    None); the on-demand terms of kept products are returned, everything else dropped. The
    terms usually follow the products; where they come first, the on-demand ones are held until
    the products say which to keep."""
    reader = _Reader(chunks)
    read = OfferRead()
    held: dict[str, Any] = {}
    for key in reader.members():
        if key == "products" and reader.peek() == "{":
            read.has_products = True
            for sku in reader.members():
                read.products += 1
                name = product(sku, reader.value())
                if name is not None:
                    read.names[sku] = name
        elif key == "terms" and reader.peek() == "{":
            for kind in reader.members():
                if kind != "OnDemand" or reader.peek() != "{":
                    reader.skip()
                    continue
                read.has_on_demand = True
                for sku in reader.members():
                    terms = reader.value()
                    if sku in read.names or not read.has_products:
                        held[sku] = terms
        else:
            reader.skip()
    reader.end()
    read.on_demand = {sku: terms for sku, terms in held.items() if sku in read.names}
    return read
