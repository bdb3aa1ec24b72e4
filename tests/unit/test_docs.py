"""The docs site: it builds in strict mode (a broken link or a missing page
fails), its generated references cover everything they claim to, the
repository cites no path outside itself, and the README's folder table names
the folders that hold code."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def _load_reference_pages():
    spec = importlib.util.spec_from_file_location("reference_pages", REPO_ROOT / "scripts" / "reference_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reference_pages = _load_reference_pages()


def _section(page: str, heading: str) -> str:
    """The text of a page under one heading (the line ``heading`` exactly), up to the next heading of its level or above."""
    lines = page.splitlines()
    assert heading in lines, f"the page has no heading {heading!r}"
    start = lines.index(heading)
    level = len(heading) - len(heading.lstrip("#"))
    end = len(lines)
    inside_code = False
    for i in range(start + 1, len(lines)):  # a "#" line inside a code block is not a heading
        if lines[i].startswith("```"):
            inside_code = not inside_code
        elif not inside_code and lines[i].startswith("#") and len(lines[i]) - len(lines[i].lstrip("#")) <= level:
            end = i
            break
    return "\n".join(lines[start:end])


# --- the site builds --------------------------------------------------------------------------------


def test_site_builds_in_strict_mode(tmp_path):
    """What CI's docs job would do: any warning (a broken link or anchor, a page missing from the nav or
    from docs/, a docstring griffe cannot read) fails the build."""
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                           cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    for path in reference_pages.PAGES:
        assert (site / path.removesuffix(".md") / "index.html").is_file(), path
    sdk = (site / "reference" / "sdk" / "index.html").read_text()
    import txlog

    # Every public name of the SDK has its entry, wherever the page puts it.
    missing = [name for name in txlog.__all__
               if f'id="txlog.{name}"' not in sdk
               and f'id="{getattr(txlog, name).__module__}.{name}"' not in sdk]
    assert missing == []


# --- the references cover what they claim --------------------------------------------------------------

PROTO_DIR = REPO_ROOT / "protos" / "txlog" / "v1"


def _cell_text(comment_line: str) -> str:
    """A comment line as the page writes it, escaped for Markdown."""
    return reference_pages._cell(comment_line)


def test_grpc_reference_has_every_service_rpc_message_and_enum_with_its_comment():
    page = reference_pages.grpc_page()
    protos = sorted(PROTO_DIR.glob("*.proto"))
    assert protos
    rpcs = 0
    for proto in protos:
        source = proto.read_text()
        assert f"## txlog/v1/{proto.name}" in page
        service = None
        comment: list[str] = []
        for line in source.splitlines():
            stripped = line.strip()
            if stripped.startswith("//"):
                comment.append(stripped.removeprefix("//").strip())
                continue
            if re.match(r"(syntax|package)\b", stripped) and comment:  # the file's own comment
                assert _cell_text(comment[0]) in page, (proto.name, comment[0])
            elif match := re.match(r"service\s+(\w+)", stripped):
                service = match.group(1)
                assert f"### service {service} {{#txlog.v1.{service}}}" in page
            elif match := re.match(r"rpc\s+(\w+)\s*\(", stripped):
                rpcs += 1
                assert f"#### {service}.{match.group(1)} {{#txlog.v1.{service}.{match.group(1)}}}" in page
                if comment:  # its leading comment comes with it (the first line, as the page wraps it)
                    assert _cell_text(comment[0]) in page, (match.group(1), comment[0])
            elif match := re.match(r"(message|enum)\s+(\w+)", stripped):
                assert re.search(rf"\.{match.group(2)}\}}$", page, re.MULTILINE), match.group(2)
            comment = []
    assert rpcs > 20


def test_grpc_reference_lists_every_field_of_every_message():
    """Checked against the compiled stubs (txlog/v1/*_pb2.py), not against the descriptor set the page is made from."""
    page = reference_pages.grpc_page()
    modules = [importlib.import_module(f"txlog.v1.{proto.stem}_pb2") for proto in sorted(PROTO_DIR.glob("*.proto"))]

    def messages(containing):
        for message in containing:
            if not message.GetOptions().map_entry:
                yield message
                yield from messages(message.nested_types)

    checked = 0
    for module in modules:
        for message in messages(module.DESCRIPTOR.message_types_by_name.values()):
            heading = next(line for line in page.splitlines() if line.endswith(f"{{#{message.full_name}}}"))
            table = _section(page, heading)
            for field in message.fields:
                assert f"| `{field.name}` |" in table, (message.full_name, field.name)
                checked += 1
    assert checked > 100


def test_cli_reference_has_every_subcommand_with_every_option():
    from txlog.cli.program import parser

    page = reference_pages.cli_page()
    top = parser()
    commands = list(reference_pages.command_parsers(top))
    # Independently of that walk: every name program.py gives add_parser appears as a command.
    declared = set(re.findall(r"add_parser\(\s*\"([\w-]+)\"", (REPO_ROOT / "txlog" / "cli" / "program.py").read_text()))
    shown = {command.prog.split()[-1] for command in commands}
    assert declared and declared <= shown, sorted(declared - shown)
    assert len(commands) > 40
    for command in commands:
        heading = next(line for line in page.splitlines()
                       if line.startswith("#") and line.split(" ", 1)[1] == command.prog)
        section = _section(page, heading)
        for action in command._actions:
            for option in action.option_strings:
                assert option in section, (command.prog, option)


@pytest.mark.parametrize("service", reference_pages.SERVICES)
def test_configuration_reference_has_every_flag_of_every_service(service):
    """The flags `python -m <service> --help` prints, each with its environment variable, on the page."""
    server = importlib.import_module(f"{service}.server")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), pytest.raises(SystemExit):
        server.main(["--help"])
    flags = set(re.findall(r"^\s+(--[a-z0-9-]+)", printed.getvalue(), re.MULTILINE)) - {"--help"}
    assert len(flags) > 20
    page = reference_pages.configuration_page()
    shown = _section(page, "## Every service") + _section(page, f"## {service}")
    for flag in flags:
        environment = "TXLOG_" + flag.removeprefix("--").replace("-", "_").upper()
        assert f"| `{flag}` | `{environment}` |" in shown, flag


def test_metrics_reference_has_every_metric_of_every_service():
    contract = importlib.util.spec_from_file_location("metrics_contract", REPO_ROOT / "tests" / "deploy" / "metrics_contract.py")
    metrics_contract = importlib.util.module_from_spec(contract)
    contract.loader.exec_module(metrics_contract)
    page = reference_pages.metrics_page()
    for service, samples in metrics_contract.EXPOSED.items():
        section = _section(page, f"## {service}")
        for sample, labels in samples.items():
            row = next((line for line in section.splitlines() if f"`{sample}`" in line), None)
            assert row is not None, (service, sample)
            for label in labels - {"le"}:
                assert f"`{label}`" in row, (service, sample, label)


def test_layout_reference_has_every_module_and_script():
    page = reference_pages.layout_page()
    files = [Path(name) for name in reference_pages.tracked_files()
             if name.endswith((".py", ".sh")) and "/" in name and (REPO_ROOT / name).is_file()]
    assert len(files) > 200
    for path in files:
        assert f"| `{path.name}` |" in _section(page, f"## {path.parent}/"), path
    documented = REPO_ROOT / "txlog" / "producer.py"
    first_paragraph = reference_pages.summary(documented)
    assert first_paragraph and first_paragraph in page


# --- the repository stands alone ---------------------------------------------------------------------

# Built, not written out, so that this file does not hold what it looks for.
SHARED_FOLDER = "../" + "shared"
_MARKDOWN_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)")
_REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
_RELATIVE_PATH = re.compile(r"(?<![\w./-])((?:\.\./)+[\w.-][\w./-]*)")


def paths_outside(root: Path, names: list[str]) -> list[str]:
    """``file: cited path`` for each place where a file under root cites a path outside it: the shared
    folder beside the repository, anywhere in any text file; in Markdown, a link or a relative path
    that resolves outside root."""
    found = []
    root = root.resolve()
    for name in names:
        path = root / name
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue  # binary, or listed but gone from the working copy
        if SHARED_FOLDER in text:
            found.append(f"{name}: {SHARED_FOLDER}")
        if path.suffix.lower() not in (".md", ".markdown"):
            continue
        cited = {*_MARKDOWN_LINK.findall(text), *_REFERENCE_LINK.findall(text), *_RELATIVE_PATH.findall(text)}
        for target in sorted(cited):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("#"):
                continue  # a URL, or an anchor on the same page
            target_path = target.split("#", 1)[0].split("?", 1)[0]
            if target_path.startswith("/"):
                resolved = Path(target_path)
            else:
                resolved = (path.parent / target_path).resolve()
            if not resolved.is_relative_to(root):
                found.append(f"{name}: {target}")
    return found


def test_no_tracked_file_cites_a_path_outside_the_repository():
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True)
    names = [name for name in listed.stdout.decode().split("\0") if name]
    assert len(names) > 100
    assert paths_outside(REPO_ROOT, names) == []


def test_the_checker_finds_paths_outside_the_repository(tmp_path):
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "inside.md").write_text("See [the design](design.md#rules) and [home](../README.md), "
                                             "<https://example.com/x>, [top](#top); `../README.md`.\n")
    (root / "README.md").write_text("[guide](docs/inside.md)\n")
    (root / "notes.py").write_text("PATH = 'one/../two'\n")
    assert paths_outside(root, ["docs/inside.md", "README.md", "notes.py"]) == []

    (root / "script.sh").write_text(f"cat {SHARED_FOLDER}/DESIGN.md\n")
    (root / "docs" / "link.md").write_text("the [design](../../elsewhere/DESIGN.md) of it\n")
    (root / "docs" / "reference.md").write_text("[design]: ../../elsewhere/DESIGN.md\n")
    (root / "docs" / "prose.md").write_text("as `../../elsewhere/notes.md` says\n")
    (root / "absolute.md").write_text("[file](/etc/hosts)\n")
    assert sorted(paths_outside(root, ["script.sh", "docs/link.md", "docs/reference.md", "docs/prose.md",
                                       "absolute.md"])) == [
        "absolute.md: /etc/hosts",
        "docs/link.md: ../../elsewhere/DESIGN.md",
        "docs/prose.md: ../../elsewhere/notes.md",
        "docs/reference.md: ../../elsewhere/DESIGN.md",
        f"script.sh: {SHARED_FOLDER}",
    ]


# --- the README's folder table --------------------------------------------------------------------------

# What makes a folder hold code: a file of one of these kinds (Helm's templates are Go templates).
CODE_SUFFIXES = {".py", ".sh", ".proto", ".js", ".mjs", ".ts", ".go", ".java", ".rs", ".tpl"}


def code_folders(names: list[str]) -> set[str]:
    """The top-level folders (hidden ones aside) holding a tracked file of code."""
    return {Path(name).parts[0] for name in names
            if "/" in name and not name.startswith(".") and Path(name).suffix in CODE_SUFFIXES}


def readme_folders(readme: str, root: Path) -> set[str]:
    """The top-level folders the README's folder table names: of its Markdown tables, the one whose first
    column names the most top-level folders; from each first cell, the first part of every `path` in it."""
    best: set[str] = set()
    for table in re.findall(r"(?:^\|.*\|[ \t]*\n)+", readme, re.MULTILINE):
        named = set()
        for row in table.splitlines()[2:]:  # after the header and its --- line
            first_cell = row.strip().strip("|").split("|")[0]
            for path in re.findall(r"`([^`]+)`", first_cell):
                top = path.strip().lstrip("./").split("/")[0]
                if top and ((root / top).is_dir() or path.strip().endswith("/")):
                    named.add(top)
        if len(named) > len(best):
            best = named
    return best


def test_readme_folder_table_names_exactly_the_folders_that_hold_code():
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True)
    names = [name for name in listed.stdout.decode().split("\0") if name]
    expected = code_folders(names)
    assert {"txlog", "services", "partition_svc", "tests"} <= expected
    named = readme_folders((REPO_ROOT / "README.md").read_text(), REPO_ROOT)
    assert sorted(expected - named) == [], "folders holding code that README.md's folder table does not name"
    assert sorted(named - expected) == [], "folders README.md's folder table names that hold no code"


def test_readme_folder_reader_on_a_planted_table(tmp_path):
    for folder in ("txlog", "helm", "docs"):
        (tmp_path / folder).mkdir()
    readme = ("# x\n\n| flag | meaning |\n| --- | --- |\n| `--zookeeper` | where |\n\n"
              "| folder | what |\n| --- | --- |\n| `txlog/` | the SDK |\n| `helm/txlog/`, `Dockerfile` | deployment |\n"
              "| `gone/` | a folder since removed |\n")
    assert readme_folders(readme, tmp_path) == {"txlog", "helm", "gone"}
    assert code_folders(["txlog/a.py", "helm/t/_helpers.tpl", "docs/a.md", ".ci/run", "README.md"]) == {"txlog", "helm"}
