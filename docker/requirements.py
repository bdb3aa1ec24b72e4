"""Prints the requirements of txlog with the given extras, one per line, read
from pyproject.toml (the Dockerfile installs them in a layer of their own,
before the code is copied, so a code change does not reinstall them):

    python docker/requirements.py service console   # the service image: the base install, `service` and `console`
    python docker/requirements.py spark             # what the Spark image adds
"""

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def requirements(extras: list[str], pyproject: Path = PYPROJECT) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = sorted(set(extras) - set(optional))
    if unknown:
        raise SystemExit(f"unknown extras {unknown}; pyproject.toml has {sorted(optional)}")
    wanted, seen = list(project["dependencies"]), set()
    pending = list(extras)
    while pending:  # an extra may name others of this project ("txlog[service,spark]")
        extra = pending.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for requirement in optional[extra]:
            own = re.fullmatch(rf"{re.escape(project['name'])}\[([^\]]+)\]", requirement.replace(" ", ""))
            if own:
                pending.extend(own.group(1).split(","))
            else:
                wanted.append(requirement)
    return list(dict.fromkeys(wanted))


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1:])))
