"""Triton's log settings over Python logging (mcp_router.frontends.logsettings): what is set is the real
level."""

from __future__ import annotations

import logging

import pytest

from mcp_router.frontends import logsettings
from mcpcore.errors import InvalidArgument


@pytest.fixture
def logger():
    log = logging.getLogger(f"test-logsettings-{id(object())}")
    log.setLevel(logging.INFO)
    return log


def test_current_reads_the_level(logger):
    assert logsettings.current(logger) == {
        "log_file": "", "log_info": True, "log_warning": True, "log_error": True,
        "log_verbose_level": 0, "log_format": "default",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "level"),
    [
        ({"log_verbose_level": 1}, logging.DEBUG),
        ({"log_info": False}, logging.WARNING),
        ({"log_info": False, "log_warning": False}, logging.ERROR),
        ({"log_info": False, "log_warning": False, "log_error": False}, logging.CRITICAL + 1),
    ],
)
def test_each_change_moves_the_real_level(logger, changes, level):
    after = logsettings.apply(changes, logger)
    assert logger.level == level
    assert all(after[k] == v for k, v in changes.items())


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"log_colour": True}, "unknown log setting 'log_colour'"),
        ({"log_info": 1}, "log_info must be a bool"),
        ({"log_verbose_level": True}, "log_verbose_level must be a int"),
        ({"log_file": "/tmp/x.log"}, "log_file is not supported"),
        ({"log_format": "ISO8601"}, "log_format 'ISO8601' is not supported"),
        ({"log_warning": False}, "a threshold"),  # info on, warning off: not a threshold
    ],
)
def test_a_bad_change_is_refused_and_nothing_moves(logger, changes, words):
    with pytest.raises(InvalidArgument, match=words):
        logsettings.apply({"log_verbose_level": 1, **changes}, logger)
    assert logger.level == logging.INFO
