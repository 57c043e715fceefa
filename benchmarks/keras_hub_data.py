"""A pytest plugin for keras-hub's test files run against its wheel, which
ships no test data: `TestCase.get_test_data_dir` answers the folder that
`KERASCALE_KERAS_HUB_DATA` names (a checkout's
`keras_hub/src/tests/test_data`). Loaded by `keras_hub_tests.py`."""

from __future__ import annotations

import os


def pytest_configure(config):
    folder = os.environ.get("KERASCALE_KERAS_HUB_DATA")
    if not folder:
        return
    from keras_hub.src.tests import test_case

    test_case.TestCase.get_test_data_dir = lambda self: folder
