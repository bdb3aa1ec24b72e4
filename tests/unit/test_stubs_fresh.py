"""The committed stubs are exactly what `python -m services.tooling.protogen` makes of protos/."""

from pathlib import Path

from services.tooling import protogen


def test_committed_stubs_match_the_protos(tmp_path):
    generated = {p.relative_to(tmp_path): p.read_text() for p in protogen.generate(tmp_path)}
    committed = {
        p.relative_to(protogen.STUBS_ROOT): p.read_text()
        for p in protogen.STUBS_ROOT.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    stale = sorted(str(path) for path in generated.keys() | committed.keys() if generated.get(path) != committed.get(path))
    assert not stale, f"stubs are stale, run `make protos` (python -m services.tooling.protogen): {stale}"


def test_every_proto_file_has_stubs():
    protos = {p.stem for p in protogen.proto_files()}
    stubs = {p.name.removesuffix("_pb2.py") for p in Path(protogen.STUBS_ROOT).rglob("*_pb2.py")}
    assert protos == stubs
