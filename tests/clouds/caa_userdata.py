"""User data as CAA's process-user-data reads it: yaml.v2's UnmarshalStrict into
`write_files: [{path, content}]` (cloud-api-adaptor, src/cloud-api-adaptor/pkg/userdata/
provision.go at fbdde75). Any other key, at the top or in an entry, fails the whole document, and
the VM then gets no apf.json. Checked by hand against yaml.v2 2.4.0 itself: a `permissions` in
an entry and a top-level `runcmd` are each refused, `path` and `content` alone are read."""

from __future__ import annotations

import yaml

CAA_DOCUMENT_KEYS = frozenset({"write_files"})
CAA_ENTRY_KEYS = frozenset({"path", "content"})


def caa_files(user_data: str) -> dict[str, str]:
    """The files CAA's process-user-data would read from `user_data` (AssertionError where it
    would refuse the document)."""
    document = yaml.safe_load(user_data)
    assert isinstance(document, dict), "not a YAML mapping"
    assert set(document) <= CAA_DOCUMENT_KEYS, (
        f"keys CAA refuses: {set(document) - CAA_DOCUMENT_KEYS}"
    )
    files: dict[str, str] = {}
    for entry in document.get("write_files") or []:
        assert set(entry) <= CAA_ENTRY_KEYS, (
            f"entry keys CAA refuses: {set(entry) - CAA_ENTRY_KEYS}"
        )
        assert isinstance(entry["path"], str) and isinstance(entry.get("content", ""), str)
        files[entry["path"]] = entry.get("content", "")
    return files
