"""The txlog release this code is: the SDK's ``txlog.__version__``, and what
every service registers in ZooKeeper (Admin.describe_cluster shows it)."""

from importlib import metadata

try:
    VERSION = metadata.version("txlog")
except metadata.PackageNotFoundError:  # run from a checkout that was never installed
    VERSION = "0+unknown"
