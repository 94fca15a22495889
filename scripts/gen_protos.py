"""Regenerate `adaptor/ttrpc/gen/` from `adaptor/ttrpc/protos/*.proto` with grpcio-tools.

One script so the generated code is never edited by hand. protoc writes flat imports
(`import ttrpc_pb2`); they are rewritten to package-relative ones so `adaptor.ttrpc.gen` works as a
package. `tests/ttrpc/test_gen.py` regenerates into a temporary directory and compares.

Usage: python scripts/gen_protos.py [OUT_DIR]   (default: adaptor/ttrpc/gen)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "adaptor" / "ttrpc" / "protos"
DEFAULT_OUT = ROOT / "adaptor" / "ttrpc" / "gen"

_FLAT_IMPORT = re.compile(r"^import (\w+_pb2) as (\w+)$", re.MULTILINE)
_INIT = '"""Generated protobuf modules: regenerate with scripts/gen_protos.py, never edit."""\n'


def generate(out_dir: Path) -> list[Path]:
    """Run protoc over every .proto file into `out_dir`; return the files written."""
    import grpc_tools
    from grpc_tools import protoc

    out_dir.mkdir(parents=True, exist_ok=True)
    protos = sorted(PROTO_DIR.glob("*.proto"))
    include = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        *(str(p) for p in protos),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    local = {p.stem + "_pb2" for p in protos}
    written: list[Path] = []
    for path in sorted(out_dir.glob("*_pb2.py*")):
        text = path.read_text()

        def _relative(match: re.Match[str]) -> str:
            module, alias = match.group(1), match.group(2)
            if module in local:
                return f"from . import {module} as {alias}"
            return match.group(0)

        path.write_text(_FLAT_IMPORT.sub(_relative, text))
        written.append(path)
    init = out_dir / "__init__.py"
    init.write_text(_INIT)
    written.append(init)
    return written


def main() -> int:
    out_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    for path in generate(out_dir):
        print(path.relative_to(out_dir.parent) if path.is_relative_to(out_dir.parent) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
