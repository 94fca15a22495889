"""The EC2 offer file read as a stream (providers.clouds._offer_stream): the same prices however
the bytes arrive, the on-demand terms whether they follow or precede the products, other terms
dropped, memory bounded by one member rather than the document, and a malformed or oversized
answer one ValueError that stops reading."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from providers.clouds import _offer_stream
from providers.clouds._offer_stream import read_offer

OFFER = Path(__file__).resolve().parent / "fakes" / "data" / "prices" / "aws-offer-us-east-1.json"


def linux(sku: str, product: Any) -> str | None:
    attributes = product["attributes"]
    if attributes.get("operatingSystem") != "Linux":
        return None
    return str(attributes.get("instanceType") or "") or None


def pieces(data: bytes, size: int) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def expected(document: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    names = {s: n for s, p in document["products"].items() if (n := linux(s, p))}
    terms = {s: t for s, t in document["terms"]["OnDemand"].items() if s in names}
    return names, terms


@pytest.mark.parametrize("size", [1, 2, 7, 64, 4096, 1 << 20])
def test_any_chunking_reads_the_same_products_and_terms(size: int) -> None:
    data = OFFER.read_bytes()
    document = json.loads(data)
    read = read_offer(pieces(data, size), linux)
    assert (read.names, read.on_demand) == expected(document)
    assert read.products == len(document["products"]) and read.names


def test_terms_before_products_and_other_terms_dropped() -> None:
    document = json.loads(OFFER.read_bytes())
    sku = next(iter(document["terms"]["OnDemand"]))
    reserved = {
        sku: {"x": {"priceDimensions": {"d": {"unit": "Hrs", "pricePerUnit": {"USD": "9"}}}}}
    }
    reordered = {
        "formatVersion": "v1.0",
        "terms": {"Reserved": reserved, "OnDemand": document["terms"]["OnDemand"]},
        "publicationDate": "2026-01-01T00:00:00Z",
        "products": document["products"],
    }
    read = read_offer(pieces(json.dumps(reordered).encode(), 333), linux)
    assert (read.names, read.on_demand) == expected(document)
    assert read.has_products and read.has_on_demand


def test_memory_is_one_member_not_the_document() -> None:
    # mostly Reserved terms, as a real offer file: 2,000 plain products, 20,000 SKUs' Reserved terms
    term = '{"a":{"priceDimensions":{"b":{"unit":"Hrs","pricePerUnit":{"USD":"0.1"}}}}}'
    products = ",".join(
        f'"P{i}":{{"attributes":{{"instanceType":"m{i}.large","operatingSystem":"Linux"}}}}'
        for i in range(2000)
    )
    pad = "x" * 600
    reserved = ",".join(f'"R{i}":{{"a":{term},"pad":"{pad}"}}' for i in range(20000))
    on_demand = ",".join(f'"P{i}":{term}' for i in range(2000))
    parts = [
        f'{{"formatVersion":"v1.0","products":{{{products}}},',
        f'"terms":{{"Reserved":{{{reserved}}},"OnDemand":{{{on_demand}}}}}}}',
    ]
    data = "".join(parts).encode()
    assert len(data) > 12_000_000
    json.loads(data)  # well formed
    tracemalloc.start()
    try:
        read = read_offer(pieces(data, 1 << 16), linux)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(read.names) == 2000 and len(read.on_demand) == 2000
    assert peak < len(data) / 4, f"peak {peak} bytes for a {len(data)}-byte document"


def endless(head: bytes, filler: bytes) -> Iterator[bytes]:
    yield head
    while True:
        yield filler


def test_an_oversized_member_stops_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_offer_stream, "MAX_MEMBER_BYTES", 1 << 20)
    with pytest.raises(ValueError, match="a value over 1048576 characters"):
        read_offer(endless(b'{"products":{"P":{"attributes":"', b"x" * 65536), linux)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<html>", "expected '{'"),
        ('{"products": {"P": {"attributes": {"x": NaN}}}}', "NaN is not a JSON number"),
        ('{"products": {} } trailing', "text after the document"),
        ('{"products": {"P": 1 "Q": 2}}', "expected ',' or '}'"),
        ('{"products": {"P": {"attributes": ', "not JSON"),
        ('{"products": {1: 2}}', "an object key is not a string"),
    ],
)
def test_malformed_answers_are_value_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_offer(pieces(text.encode(), 5), lambda sku, p: None)
