"""The error family (``mcpcore.errors``, pure) and its tables to the transports (``mcpcore.transport``)."""

import subprocess
import sys
import tomllib
from pathlib import Path

import grpc
import pytest

from mcpcore import errors
from mcpcore.errors import Code
from mcpcore.transport import grpc_status, http_status


def test_table_covers_every_class_once():
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.MCPError)]
    for cls in classes:
        if cls is not errors.MCPError:
            assert errors.CODE_TO_ERROR[cls.code] is cls
    assert len(set(errors.CODE_TO_ERROR.values())) == len(errors.CODE_TO_ERROR)


@pytest.mark.parametrize("cls", list(errors.CODE_TO_ERROR.values()), ids=lambda c: c.__name__)
def test_int_codes_from_zmq_headers_map_back(cls):
    err = errors.error_for_code(int(cls.code), "m")
    assert type(err) is cls and err.message == "m"


def test_a_code_with_no_class_keeps_the_code():
    err = errors.error_for_code(Code.UNIMPLEMENTED, "not here")
    assert type(err) is errors.MCPError and err.code is Code.UNIMPLEMENTED
    assert str(err) == "UNIMPLEMENTED: not here"
    assert errors.error_for_code(99, "m").code is Code.UNKNOWN  # a number from a newer peer


def test_a_transport_status_is_refused_not_taken_for_unknown():
    with pytest.raises(TypeError, match=r"StatusCode\.NOT_FOUND"):
        errors.error_for_code(grpc.StatusCode.NOT_FOUND, "m")  # type: ignore[arg-type]


def test_only_unavailable_and_deadline_are_retryable():
    retryable = {c for c in errors.CODE_TO_ERROR.values() if c.retryable}
    assert retryable == {errors.Unavailable, errors.DeadlineExceeded}


@pytest.mark.parametrize(
    ("err", "cls"),
    [
        (errors.DeadlineExceeded("x"), "timeout"),
        (errors.ResourceExhausted("x"), "resource"),
        (errors.Unavailable("x"), "unavailable"),
        (errors.InvalidArgument("x"), "client"),
        (errors.NotFound("x"), "client"),
        (errors.Internal("x"), "backend"),
        (errors.DataLoss("x"), "backend"),
        (RuntimeError("x"), "backend"),
    ],
)
def test_error_classes_for_the_breaker(err, cls):
    assert errors.error_class(err) == cls
    assert (cls in errors.SERVER_SIDE_CLASSES) == (cls != "client")


def test_code_names_from_json_documents_map_back():
    assert type(errors.error_for_code("RESOURCE_EXHAUSTED", "m")) is errors.ResourceExhausted
    assert errors.error_for_code("NO_SUCH_CODE", "m").code is Code.UNKNOWN


def test_a_message_quoting_a_hostile_name_is_cut_in_the_middle():
    name = "x" * 10_000
    err = errors.InvalidArgument(f"input {name}: unknown datatype 'FP99'")
    assert len(err.message) < errors.MAX_MESSAGE_CHARS + 100
    assert err.message.startswith("input xxx") and err.message.endswith("unknown datatype 'FP99'")
    assert "characters cut" in err.message
    assert errors.InvalidArgument("short").message == "short"


_PROBE = """
import importlib, sys
for module in sys.argv[1].split(","):
    importlib.import_module(module)
print(" ".join(sorted(m for m in sys.modules if m.split(".")[0] in sys.argv[2].split(","))))
"""
IO_LIBRARIES = ("grpc", "zmq", "etcd3aio", "prometheus_client")


def _loaded_after_import(modules: list[str], libraries: tuple[str, ...]) -> list[str]:
    """The modules of ``libraries`` a fresh interpreter holds after importing ``modules``."""
    argv = [sys.executable, "-c", _PROBE, ",".join(modules), ",".join(libraries)]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()


def test_importing_the_errors_loads_no_transport():
    """The pure modules import ``mcpcore.errors``; it must bring no grpc (nor zmq, etcd, prometheus, and
    not even protobuf)."""
    assert _loaded_after_import(["mcpcore.errors"], (*IO_LIBRARIES, "google")) == []
    # the probe sees an import when there is one (so an empty answer means none)
    assert "grpc" in _loaded_after_import(["mcpcore.transport.grpc_status"], IO_LIBRARIES)


#: Pure modules whose *package* ``__init__`` loads an I/O library (import-linter does not follow a
#: package's ``__init__``, so the contract passes): each with the library and why. The test fails when
#: one is fixed, so the entry goes with the fix.
PACKAGE_INIT_LOADS: dict[str, tuple[str, str]] = {}


def test_the_pure_modules_load_no_io_library_at_run_time():
    """What import-linter's "Pure logic modules do no I/O" contract checks on the import graph, checked on
    a running interpreter, where each package's ``__init__`` runs too."""
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    contracts = pyproject["tool"]["importlinter"]["contracts"]
    [pure] = [c for c in contracts if c["name"].startswith("Pure logic")]
    assert pure["allow_indirect_imports"] is False
    assert tuple(pure["forbidden_modules"]) == IO_LIBRARIES
    assert "mcpcore.errors" in pure["source_modules"]
    clean = [m for m in pure["source_modules"] if m not in PACKAGE_INIT_LOADS]
    assert _loaded_after_import(clean, IO_LIBRARIES) == []
    for module, (library, _why) in PACKAGE_INIT_LOADS.items():
        assert module in pure["source_modules"]
        assert library in _loaded_after_import([module], IO_LIBRARIES), f"{module} is clean now: drop it here"


@pytest.mark.parametrize("status", list(grpc.StatusCode), ids=lambda s: s.name)
def test_each_grpc_status_is_the_code_of_the_same_name_and_number(status):
    code = grpc_status.from_grpc(status)
    assert code.name == status.name and int(code) == status.value[0]
    assert grpc_status.to_grpc(code) is status


def test_the_two_status_sets_are_the_same():
    assert {c.name for c in Code} == {s.name for s in grpc.StatusCode}


def test_a_grpc_status_becomes_its_error():
    err = grpc_status.error_for_status(grpc.StatusCode.PERMISSION_DENIED, "no key")
    assert type(err) is errors.PermissionDenied and err.message == "no key"


@pytest.mark.parametrize("code", list(Code), ids=lambda c: c.name)
def test_every_code_has_an_http_status(code):
    assert code in http_status.HTTP_STATUS
    assert http_status.http_status(code) == http_status.HTTP_STATUS[code]
