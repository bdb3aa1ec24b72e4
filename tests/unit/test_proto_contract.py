"""The contract's hygiene, checked with buf (a dev dependency of clients/node,
installed by scripts/setup.sh): protos/ is lint clean, and wire compatible
with the last release, whose protos are kept as a buf image in
protos/releases/. Also what buf's rules cannot see: every released ErrorCode
keeps its class and gRPC status, and code names read without their prefix."""

import shutil
import subprocess
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from txlog.protocol.errors import ERROR_TABLE, ErrorClass, ErrorCode, spec_of
from txlog.v1 import errors_pb2

ROOT = Path(__file__).resolve().parents[2]
BUF = ROOT / "clients" / "node" / "node_modules" / ".bin" / "buf"
RELEASED = ROOT / "protos" / "releases" / "v0.1.0.binpb"
BUF_TIMEOUT_S = 120


def buf(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    assert BUF.exists(), f"{BUF} is missing: run scripts/setup.sh (it installs clients/node's packages, buf among them)"
    return subprocess.run([str(BUF), *args], cwd=cwd, capture_output=True, text=True, timeout=BUF_TIMEOUT_S)


def test_the_protos_are_buf_lint_clean():
    done = buf("lint")
    assert done.returncode == 0, f"buf lint:\n{done.stdout}{done.stderr}"


def test_the_protos_are_wire_compatible_with_the_last_release():
    done = buf("breaking", "--against", str(RELEASED))
    assert done.returncode == 0, f"buf breaking against {RELEASED.name}:\n{done.stdout}{done.stderr}"


@pytest.mark.parametrize("change, what", [
    (("int64 base_offset = 4;", "int64 base_offset = 44;"), "base_offset"),  # a renumbered field
    (("ERROR_CODE_NOT_LEADER = 13", "ERROR_CODE_NOT_LEADER = 113"), "13"),  # a renumbered error code
])
def test_the_breaking_check_catches_a_wire_break(tmp_path, change, what):
    """The configuration is not vacuous: a copy of protos/ with one wire break fails it."""
    shutil.copytree(ROOT / "protos", tmp_path / "protos")
    shutil.copy(ROOT / "buf.yaml", tmp_path / "buf.yaml")
    changed = [p for p in (tmp_path / "protos" / "txlog" / "v1").glob("*.proto") if change[0] in p.read_text()]
    assert changed, f"no proto holds {change[0]!r}: pick another field for this test"
    changed[0].write_text(changed[0].read_text().replace(change[0], change[1], 1))
    done = buf("breaking", "--against", str(RELEASED), cwd=tmp_path)
    assert done.returncode != 0 and what in done.stdout, f"buf breaking missed {change}:\n{done.stdout}{done.stderr}"


def released_error_codes() -> dict[int, descriptor_pb2.EnumValueDescriptorProto]:
    # A buf image is wire compatible with a FileDescriptorSet (its own fields are unknown here).
    image = descriptor_pb2.FileDescriptorSet.FromString(RELEASED.read_bytes())
    errors = next(f for f in image.file if f.name == "txlog/v1/errors.proto")
    return {v.number: v for v in next(e for e in errors.enum_type if e.name == "ErrorCode").value}


def test_every_released_error_code_keeps_its_class_and_grpc_status():
    released = released_error_codes()
    assert len(released) > 40
    for number, value in released.items():
        now = errors_pb2.ErrorCode.DESCRIPTOR.values_by_number[number].GetOptions()
        was = value.options
        assert (now.Extensions[errors_pb2.error_class], now.Extensions[errors_pb2.grpc_code]) == \
            (was.Extensions[errors_pb2.error_class], was.Extensions[errors_pb2.grpc_code]), value.name
        # the names lost nothing but the prefix buf's style asks for
        assert ErrorCode.Name(number) == value.name


def test_error_codes_are_named_without_their_prefix():
    assert errors_pb2.ErrorCode.Name(ErrorCode.Value("PRODUCER_FENCED")) == "ERROR_CODE_PRODUCER_FENCED"
    assert all(not spec.name.startswith("ERROR_CODE_") for spec in ERROR_TABLE.values())
    assert spec_of(ErrorCode.Value("NOT_LEADER")).error_class is ErrorClass.RETRIABLE
    with pytest.raises(ValueError):
        ErrorCode.Value("ERROR_CODE_NOT_LEADER")  # one spelling, not two
