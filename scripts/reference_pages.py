"""The docs site's reference pages, generated from the source at every build.

mkdocs.yml loads this file as a hook: ``on_files`` adds the pages under
``reference/`` to the build, so they are never committed and cannot drift from
the code. Each page comes from what defines it: the SDK's API from its
docstrings (mkdocstrings renders ``::: txlog.Producer``), the gRPC API from the
comments of protos/txlog/v1 (read from a descriptor set that protoc builds with
its source info), the ``txlog`` command from its argparse parser, the services'
settings from their ``Setting`` lists, the metrics from what the services'
instruments export, the layout from the tracked files of the tree.

``python scripts/reference_pages.py OUT_DIR`` writes the same pages into a
folder, to read them without building the site.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # the services' packages, when a checkout is not installed
    sys.path.insert(0, str(REPO_ROOT))

# The SDK's public face, in the order the page shows it: objects, or whole modules. The names of
# txlog.__all__ none of these covers follow under "Other names", so none is left out.
SDK_OBJECTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Clients", ("txlog.Producer", "txlog.Consumer", "txlog.Admin", "txlog.TransactionChecker")),
    ("Asyncio clients", ("txlog.AIOProducer", "txlog.AIOConsumer")),
    ("Value types", ("txlog.structs",)),
    ("Serialization", ("txlog.serde",)),
    ("Access control", ("txlog.AclBinding", "txlog.AclFilter")),
    ("Errors", ("txlog.errors",)),
)


def _cell(text: str) -> str:
    """Text for one Markdown table cell: one line, pipes escaped, raw HTML
    shown as text (outside code spans, where it already is)."""
    flat = " ".join(text.split())
    parts = flat.split("`")
    for i in range(0, len(parts), 2):  # the even parts are outside code spans
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts).replace("|", "\\|")


def _paragraphs(comment: str) -> str:
    """A proto comment as Markdown prose: lines joined, blank lines kept."""
    lines = [line[1:] if line.startswith(" ") else line for line in comment.strip("\n").splitlines()]
    return "\n".join(_cell(line) if line.strip() else "" for line in lines).strip()


# --- the SDK --------------------------------------------------------------------------------------


def sdk_page() -> str:
    out = [
        "# Python SDK",
        "",
        "The SDK's public API, rendered from its docstrings: `from txlog import Producer, Consumer, Admin, "
        "TransactionChecker`, and `txlog.errors` for the exception types.",
        "",
    ]
    for title, objects in SDK_OBJECTS:
        out += [f"## {title}", ""]
        for name in objects:
            out += [f"::: {name}", ""]
    others = sdk_names_elsewhere()
    if others:
        out += ["## Other names", ""]
        for name in others:
            out += [f"::: txlog.{name}", ""]
    return "\n".join(out)


def sdk_names_elsewhere() -> list[str]:
    """The names of txlog.__all__ that SDK_OBJECTS neither names nor holds in one of its modules."""
    import txlog

    shown = {name for _, objects in SDK_OBJECTS for name in objects}
    return [name for name in sorted(txlog.__all__)
            if f"txlog.{name}" not in shown and getattr(txlog, name).__module__ not in shown]


# --- the gRPC API ---------------------------------------------------------------------------------

# Field numbers of descriptor.proto, as source_code_info paths use them.
_FILE_PACKAGE, _FILE_MESSAGES, _FILE_ENUMS, _FILE_SERVICES, _FILE_SYNTAX = 2, 4, 5, 6, 12
_MESSAGE_FIELDS, _MESSAGE_NESTED, _MESSAGE_ENUMS = 2, 3, 4
_ENUM_VALUES = 2
_SERVICE_METHODS = 2


def proto_descriptors():
    """protos/txlog/v1 as a FileDescriptorSet with comments (protoc's --include_source_info)."""
    import grpc_tools
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    from services.tooling.protogen import PROTO_ROOT, proto_files

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "txlog.pb"
        args = ["grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{well_known}", "--include_source_info",
                f"--descriptor_set_out={out}", *[str(p.relative_to(PROTO_ROOT)) for p in proto_files()]]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed: {' '.join(args)}")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def _type_name(field, map_entries: dict) -> str:
    from google.protobuf import descriptor_pb2

    if field.type_name.lstrip(".") in map_entries:  # a map<K, V> is a repeated nested <Field>Entry message
        key, value = map_entries[field.type_name.lstrip(".")]
        return f"map&lt;{_type_name(key, map_entries)}, {_type_name(value, map_entries)}&gt;"
    if field.type_name:
        name = field.type_name.lstrip(".")
        shown = name.removeprefix("txlog.v1.")
        link = f"[{shown}](#{name})" if name.startswith("txlog.v1.") else f"`{name}`"
    else:
        type_label = descriptor_pb2.FieldDescriptorProto.Type.Name(field.type)
        link = f"`{type_label.removeprefix('TYPE_').lower()}`"
    if field.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED:
        return f"repeated {link}"
    if field.proto3_optional:
        return f"optional {link}"
    return link


def _comment(locations: dict, path: tuple[int, ...]) -> str:
    location = locations.get(path)
    if location is None:
        return ""
    return "\n\n".join(c.strip("\n") for c in (location.leading_comments, location.trailing_comments) if c.strip())


def _enum_section(enum, prefix: str, path: tuple[int, ...], locations: dict, level: int) -> list[str]:
    full = f"{prefix}.{enum.name}"
    out = [f"{'#' * level} enum {full.removeprefix('txlog.v1.')} {{#{full}}}", ""]
    if text := _paragraphs(_comment(locations, path)):
        out += [text, ""]
    out += ["| value | number | description |", "| --- | --- | --- |"]
    for i, value in enumerate(enum.value):
        out.append(f"| `{value.name}` | {value.number} | {_cell(_comment(locations, (*path, _ENUM_VALUES, i)))} |")
    return [*out, ""]


def _map_entries(files) -> dict:
    """{full name of a map's entry message: (key field, value field)} of every file."""
    entries = {}

    def visit(message, prefix: str) -> None:
        full = f"{prefix}.{message.name}"
        if message.options.map_entry:
            entries[full] = (message.field[0], message.field[1])
        for nested in message.nested_type:
            visit(nested, full)

    for proto in files:
        for message in proto.message_type:
            visit(message, proto.package)
    return entries


def _message_section(message, prefix: str, path: tuple[int, ...], locations: dict, level: int,
                     map_entries: dict) -> list[str]:
    full = f"{prefix}.{message.name}"
    out = [f"{'#' * level} {full.removeprefix('txlog.v1.')} {{#{full}}}", ""]
    if text := _paragraphs(_comment(locations, path)):
        out += [text, ""]
    if message.field:
        out += ["| field | type | number | description |", "| --- | --- | --- | --- |"]
        for i, field in enumerate(message.field):
            oneof = ""
            if field.HasField("oneof_index") and not field.proto3_optional:
                oneof = f" (one of `{message.oneof_decl[field.oneof_index].name}`)"
            description = _cell(_comment(locations, (*path, _MESSAGE_FIELDS, i)))
            out.append(f"| `{field.name}` | {_type_name(field, map_entries)}{oneof} | {field.number} | {description} |")
        out.append("")
    else:
        out += ["No fields.", ""]
    for i, enum in enumerate(message.enum_type):
        out += _enum_section(enum, full, (*path, _MESSAGE_ENUMS, i), locations, level)
    for i, nested in enumerate(message.nested_type):
        if nested.options.map_entry:
            continue
        out += _message_section(nested, full, (*path, _MESSAGE_NESTED, i), locations, level, map_entries)
    return out


def grpc_page() -> str:
    out = [
        "# gRPC API",
        "",
        "Every service, RPC, message and enum of `protos/txlog/v1`, with the comments of the .proto files "
        "(generated from them at each build). Clients in other languages generate their stubs from the same files.",
        "",
    ]
    files = proto_descriptors().file
    map_entries = _map_entries(files)
    for proto in files:
        if not proto.name.startswith("txlog/"):
            continue
        locations = {tuple(loc.path): loc for loc in proto.source_code_info.location}
        prefix = proto.package
        out += [f"## {proto.name}", ""]
        # The file's own comment sits above `syntax` (or `package`), attached or apart from it.
        for statement in (_FILE_SYNTAX, _FILE_PACKAGE):
            location = locations.get((statement,))
            if location is not None:
                for comment in (*location.leading_detached_comments, location.leading_comments):
                    if comment.strip():
                        out += [_paragraphs(comment), ""]
        for s, service in enumerate(proto.service):
            service_path = (_FILE_SERVICES, s)
            out += [f"### service {service.name} {{#{prefix}.{service.name}}}", ""]
            if text := _paragraphs(_comment(locations, service_path)):
                out += [text, ""]
            for m, method in enumerate(service.method):
                request, response = (t.lstrip(".") for t in (method.input_type, method.output_type))
                streams = ("stream " if method.client_streaming else "", "stream " if method.server_streaming else "")
                out += [
                    f"#### {service.name}.{method.name} {{#{prefix}.{service.name}.{method.name}}}",
                    "",
                    f"`rpc {method.name}({streams[0]}{request.removeprefix('txlog.v1.')}) returns "
                    f"({streams[1]}{response.removeprefix('txlog.v1.')})`: "
                    f"[request](#{request}), [response](#{response})",
                    "",
                ]
                if text := _paragraphs(_comment(locations, (*service_path, _SERVICE_METHODS, m))):
                    out += [text, ""]
        if proto.message_type:
            out += ["### Messages", ""]
            for i, message in enumerate(proto.message_type):
                out += _message_section(message, prefix, (_FILE_MESSAGES, i), locations, 4, map_entries)
        if proto.enum_type:
            out += ["### Enums", ""]
            for i, enum in enumerate(proto.enum_type):
                out += _enum_section(enum, prefix, (_FILE_ENUMS, i), locations, 4)
    return "\n".join(out)


# --- the txlog command ----------------------------------------------------------------------------


def command_parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """The parser and, depth first, the parser of every subcommand under it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen = set()
            for sub in action.choices.values():
                if id(sub) not in seen:  # an alias names the same parser again
                    seen.add(id(sub))
                    yield from command_parsers(sub)


@contextlib.contextmanager
def _help_width(columns: int) -> Iterator[None]:
    """argparse wraps help at the terminal's width (COLUMNS): fixed, so the page is the same on every machine."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(columns)
    try:
        yield
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def cli_page() -> str:
    from txlog.cli.program import parser

    out = [
        "# The txlog command",
        "",
        "Every subcommand of `txlog` with its help, as `txlog ... --help` prints it (generated from the command's "
        "parser at each build).",
        "",
    ]
    with _help_width(100):
        for command in command_parsers(parser()):
            depth = len(command.prog.split())
            out += [f"{'#' * min(depth + 1, 6)} {command.prog}", "", "```text", command.format_help().rstrip(), "```", ""]
    return "\n".join(out)


# --- the services' settings -----------------------------------------------------------------------

SERVICES = ("producer_id_svc", "coordinator_svc", "partition_svc")


def service_settings():
    """(every service's settings, {service: its own settings}), as services.runtime.server.run composes them."""
    from services.runtime import config, server

    shared = (*config.COMMON_SETTINGS, *server.SERVER_SETTINGS)
    own = {name: tuple(importlib.import_module(f"{name}.server").SETTINGS) for name in SERVICES}
    return shared, own


def configuration_page() -> str:
    from services.runtime import config

    shared, own = service_settings()
    out = [
        "# Service configuration",
        "",
        "Each setting is read, in order of precedence, from its flag, its environment variable and its default "
        "(`python -m partition_svc --help` lists the same). Generated from the services' setting lists at each build.",
        "",
        "## Every service",
        "",
        "`producer_id_svc`, `coordinator_svc` and `partition_svc` all take these.",
        "",
        config.markdown_table(shared),
        "",
    ]
    for name, settings in own.items():
        out += [f"## {name}", "", f"`python -m {name}` takes these besides the ones above.", "",
                config.markdown_table(settings), ""]
    return "\n".join(out)


# --- metrics --------------------------------------------------------------------------------------


def _metrics_contract():
    """tests/deploy/metrics_contract.py, which drives each service's instruments once (it is not a package)."""
    path = REPO_ROOT / "tests" / "deploy" / "metrics_contract.py"
    spec = importlib.util.spec_from_file_location("txlog_metrics_contract", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def metric_families() -> dict[str, list[tuple[str, str, str, list[str], list[str]]]]:
    """{service: [(name, type, help, sample names, labels)]} as the services' /metrics shows them."""
    from prometheus_client.parser import text_string_to_metric_families

    contract = _metrics_contract()
    families = {}
    for service, text in contract.expositions().items():
        rows = []
        for family in text_string_to_metric_families(text):
            if family.name == "target_info":  # the process's resource, not a measurement
                continue
            samples = sorted({s.name for s in family.samples})
            labels = sorted(set().union(*(s.labels for s in family.samples)) - contract.OTEL_SCOPE_LABELS - {"le"})
            rows.append((family.name, family.type, family.documentation, samples, labels))
        families[service] = sorted(rows)
    return families


def metrics_page() -> str:
    out = [
        "# Metrics",
        "",
        "What each service exports at `http://<metrics_listen>/metrics` (Prometheus text; set `--metrics-listen`) "
        "and over OTLP (`--otel-exporter otlp`, where names keep their dots: `txlog.rpc.errors`). "
        "Generated at each build from the services' own instruments, read through the Prometheus exporter. "
        "Every sample also carries `otel_scope_name`, `otel_scope_version` and `otel_scope_schema_url`.",
        "",
    ]
    for service, rows in metric_families().items():
        out += [f"## {service}", "", "| metric | type | labels | samples | description |", "| --- | --- | --- | --- | --- |"]
        for name, kind, description, samples, labels in rows:
            shown_labels = ", ".join(f"`{label}`" for label in labels) or "none"
            shown_samples = ", ".join(f"`{sample}`" for sample in samples)
            out.append(f"| `{name}` | {kind} | {shown_labels} | {shown_samples} | {_cell(description)} |")
        out.append("")
    return "\n".join(out)


# --- the layout -----------------------------------------------------------------------------------

def tracked_files() -> list[str]:
    """The repository's tracked files (git ls-files), or every file under it outside git's ignores when
    it is not a git checkout (a source archive)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        skipped = {".git", ".venv", "site", "build", "dist", "node_modules", "__pycache__"}
        return sorted(str(p.relative_to(REPO_ROOT)) for p in REPO_ROOT.rglob("*")
                      if p.is_file() and not skipped & set(p.relative_to(REPO_ROOT).parts))
    return sorted(name for name in listed.stdout.decode().split("\0") if name)


def summary(path: Path) -> str:
    """The first paragraph of a Python module's docstring (its first line is
    often cut mid-sentence), or a shell script's leading comment line."""
    text = path.read_text(errors="replace")
    if path.suffix == ".py":
        try:
            docstring = ast.get_docstring(ast.parse(text))
        except SyntaxError:
            docstring = None
        if docstring:
            return " ".join(docstring.strip().split("\n\n")[0].split())
        if text.startswith("# Generated by"):  # the protobuf stubs
            return text.splitlines()[0].removeprefix("# ")
        if path.name == "__main__.py":
            return f"`python -m {path.parent.name}`"
        return ""
    for line in text.splitlines():
        if line.startswith("#!"):
            continue
        return line.lstrip("#").strip() if line.startswith("#") else ""
    return ""


def layout_modules() -> dict[str, list[str]]:
    """{folder: its Python modules and shell scripts}, for every folder of the tree holding some."""
    folders: dict[str, list[str]] = {}
    for name in tracked_files():
        path = Path(name)
        if len(path.parts) > 1 and path.suffix in (".py", ".sh") and (REPO_ROOT / path).is_file():
            folders.setdefault(str(path.parent), []).append(name)
    return dict(sorted(folders.items()))


def layout_page() -> str:
    out = [
        "# Layout",
        "",
        "Every package, module and script of the tree with the first line of its docstring, generated from the "
        "repository's files at each build.",
        "",
    ]
    for folder, names in layout_modules().items():
        out += [f"## {folder}/", "", "| file | what it is |", "| --- | --- |"]
        for name in names:
            out.append(f"| `{Path(name).name}` | {_cell(summary(REPO_ROOT / name)) or '—'} |")
        out.append("")
    return "\n".join(out)


# --- the pages, and the hook ----------------------------------------------------------------------

PAGES: dict[str, Callable[[], str]] = {
    "reference/sdk.md": sdk_page,
    "reference/grpc.md": grpc_page,
    "reference/cli.md": cli_page,
    "reference/configuration.md": configuration_page,
    "reference/metrics.md": metrics_page,
    "reference/layout.md": layout_page,
}


def on_files(files, config):
    """MkDocs hook: adds the generated pages to the site's files."""
    from mkdocs.structure.files import File

    for path, make in PAGES.items():
        if files.get_file_from_path(path) is not None:
            raise RuntimeError(f"docs/{path} is generated: remove the file from docs/")
        files.append(File.generated(config, path, content=make()))
    return files


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description="Write the docs site's generated reference pages into a folder.")
    cli.add_argument("out", type=Path, help="folder to write reference/*.md into")
    args = cli.parse_args(argv)
    for path, make in PAGES.items():
        target = args.out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(make())
        print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
