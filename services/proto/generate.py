"""Regenerate the committed gRPC/protobuf code from ``protos/``.

    python -m services.proto.generate            # rewrite services/proto/capc/v1
    python -m services.proto.generate --check    # exit 1 if the committed code drifted

The .proto files live under the ``capc.v1`` package, which would collide with
the ``capc`` library in Python imports, so generated imports are rewritten to
``services.proto.capc.v1``.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTOS = ROOT / "protos"
OUT = ROOT / "services" / "proto"
PACKAGE = "capc/v1"
_IMPORT = re.compile(r"^from capc\.v1 import ", re.MULTILINE)
_IMPORT_AS = re.compile(r"^import capc\.v1\.(\w+) as ", re.MULTILINE)


def generate(out_dir: Path) -> list[Path]:
    """Run protoc (grpcio-tools) into ``out_dir``; returns the written files."""
    from grpc_tools import protoc  # a dev/codegen dependency only

    sources = sorted((PROTOS / PACKAGE).glob("*.proto"))
    args = [
        "protoc",
        f"-I{PROTOS}",
        f"-I{_well_known()}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
    ]
    if protoc.main([*args, *map(str, sources)]) != 0:
        raise RuntimeError("protoc failed")
    written = []
    for path in sorted((out_dir / PACKAGE).glob("*.py*")):
        text = _IMPORT.sub("from services.proto.capc.v1 import ", path.read_text())
        text = _IMPORT_AS.sub(r"import services.proto.capc.v1.\1 as ", text)
        path.write_text(text)
        written.append(path)
    for pkg in (out_dir / "capc", out_dir / PACKAGE):
        (pkg / "__init__.py").write_text(
            '"""Generated code: do not edit; run python -m services.proto.generate."""\n'
        )
    return written


def _well_known() -> str:
    import grpc_tools

    return str(Path(grpc_tools.__file__).parent / "_proto")


def drift() -> list[str]:
    """Files whose committed content differs from a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        generate(fresh)
        diffs = []
        for path in sorted((fresh / "capc").rglob("*.py*")):
            rel = path.relative_to(fresh)
            committed = OUT / rel
            if not committed.exists() or committed.read_text() != path.read_text():
                diffs.append(str(rel))
        for path in sorted((OUT / "capc").rglob("*.py*")):
            if not (fresh / path.relative_to(OUT)).exists():
                diffs.append(f"{path.relative_to(OUT)} (no longer generated)")
        return diffs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    if args.check:
        diffs = drift()
        for d in diffs:
            print(f"drifted: {d}")
        return 1 if diffs else 0
    for path in generate(OUT):
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
