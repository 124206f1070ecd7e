import grpc
import pytest

from mcpcore import errors


def test_table_covers_every_class_once():
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.MCPError)]
    for cls in classes:
        if cls is not errors.MCPError:
            assert errors.CODE_TO_ERROR[cls.code] is cls
    assert len(set(errors.CODE_TO_ERROR.values())) == len(errors.CODE_TO_ERROR)


@pytest.mark.parametrize("cls", list(errors.CODE_TO_ERROR.values()), ids=lambda c: c.__name__)
def test_int_codes_from_zmq_headers_map_back(cls):
    err = errors.error_for_code(cls.code.value[0], "m")
    assert type(err) is cls and err.message == "m"


def test_unknown_code_keeps_the_code():
    err = errors.error_for_code(grpc.StatusCode.ABORTED, "aborted")
    assert err.code is grpc.StatusCode.ABORTED
    assert isinstance(err, errors.MCPError)


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
    assert errors.error_for_code("NO_SUCH_CODE", "m").code is grpc.StatusCode.UNKNOWN


def test_a_message_quoting_a_hostile_name_is_cut_in_the_middle():
    name = "x" * 10_000
    err = errors.InvalidArgument(f"input {name}: unknown datatype 'FP99'")
    assert len(err.message) < errors.MAX_MESSAGE_CHARS + 100
    assert err.message.startswith("input xxx") and err.message.endswith("unknown datatype 'FP99'")
    assert "characters cut" in err.message
    assert errors.InvalidArgument("short").message == "short"
