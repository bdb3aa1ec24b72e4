"""Helpers the tests share, one copy each.

* ``support.waiting``: ``wait_until``, a condition waited for with a deadline;
* ``support.reads``: the isolation levels and ``values``, what a partition holds as strings;
* ``support.errors``: ``error_name`` of an answer, ``failure_name`` of a call.

Test files import them as ``from support.waiting import wait_until``: pytest puts
the folder of tests/conftest.py (a rootdir conftest without ``__init__.py``)
on ``sys.path`` before it imports any test module, in every xdist worker too,
as it puts tests/integ there for ``from raw import Raw``.
"""
