"""The binding itself: loading, the ABI check, errors, configurations, dtypes, logs."""

import logging
import os
import subprocess
import sys

import pytest

import ectransfer
from ectransfer import _lib


def test_loads_the_library_it_was_told_to():
    assert os.path.realpath(ectransfer.LIBRARY_PATH) == os.path.realpath(os.environ["ECT_LIBRARY"])
    assert ectransfer.version().count(".") == 2
    assert _lib.lib.ect_abi_version() == ectransfer.ABI_VERSION
    # every mirrored struct is at least as large as the binding thinks
    for name, (mirror, exact) in _lib._MIRRORS.items():
        assert _lib.SIZES[name] >= _lib.ctypes.sizeof(mirror)
        if exact:
            assert _lib.SIZES[name] == _lib.ctypes.sizeof(mirror)


def _import_in_child(env_extra):
    env = dict(os.environ, **env_extra)
    return subprocess.run([sys.executable, "-c", "import ectransfer"], env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_missing_library_is_a_clear_import_error(tmp_path):
    r = _import_in_child({"ECT_LIBRARY": str(tmp_path / "nope.so")})
    assert r.returncode != 0
    assert "libectransfer not found" in r.stderr and "ECT_LIBRARY" in r.stderr


def test_a_library_of_another_abi_is_refused(tmp_path):
    # A library without ect_abi_version (any other shared object) is refused by name.
    r = _import_in_child({"ECT_LIBRARY": "libz.so.1"})
    assert r.returncode != 0
    assert "has no ect_abi_version" in r.stderr


def test_errors_carry_code_and_sentence():
    with pytest.raises(ectransfer.Error) as ei:
        ectransfer.PushConsumer({"ec_prot": 1})
    e = ei.value
    assert e.code == ectransfer.ECT_EINVAL == -1
    assert e.name == "ECT_EINVAL"
    assert e.sentence == "invalid argument"
    assert "unknown key 'ec_prot'" in e.detail
    assert str(e).startswith("ECT_EINVAL (invalid argument): ")
    # the binding's sentences are the library's
    for code in ectransfer.CODES:
        assert _lib.Error(code).sentence == _lib.lib.ect_strerror(code).decode()


@pytest.mark.parametrize(
    "cls,cfg,part",
    [
        (ectransfer.PushConsumer, {"ec_port": "14579"}, "'ec_port' must be an integer"),
        (ectransfer.PushConsumer, {"tp_size": 2, "tp_rank": 0, "quarantine_ms": 5},
         "'quarantine_ms' is not an option of the push consumer"),
        (ectransfer.PushScheduler, {"accept_any": 1}, "'accept_any' must be true or false"),
        (ectransfer.PushProducer, {"control_timeout_s": 0}, "'control_timeout_s'"),
        (ectransfer.PullProducer, {"ec_ip": 5}, "'ec_ip' must be a string"),
        (ectransfer.PullConsumer, {"ec_port": 0}, "'ec_port'"),
        (ectransfer.PullScheduler, {"ec_port": 1.5}, "'ec_port' must be an integer"),
        (ectransfer.PushProducer, "[1]", "must be a JSON object"),
    ],
)
def test_bad_configurations_name_the_key(cls, cfg, part):
    with pytest.raises(ectransfer.Error) as ei:
        cls(cfg)
    assert ei.value.code == ectransfer.ECT_EINVAL
    assert part in str(ei.value)


def test_one_dict_configures_every_role_of_an_instance():
    shared = {"ec_ip": "127.0.0.1", "ec_port": 0, "ec_buffer_size": 1 << 20, "tp_size": 1,
              "control_timeout_s": 5, "push_wait_timeout_s": 5, "transport": "tcp"}
    with ectransfer.PushConsumer(shared) as c:
        assert c.port > 0 and c.address == f"127.0.0.1:{c.port}"
        with ectransfer.PushScheduler(dict(shared, ec_port=c.port)):
            pass
    with ectransfer.PushProducer(shared):
        pass


def test_dtype_names():
    assert ectransfer.dtype_name("torch.bfloat16") == "bfloat16"
    assert ectransfer.dtype_name("float8_e4m3fn") == "float8_e4m3fn"
    with pytest.raises(ectransfer.Error, match="not one ectransfer moves"):
        ectransfer.dtype_name("float128")
    np = pytest.importorskip("numpy")
    assert ectransfer.dtype_name(np.dtype("float16")) == "float16"
    assert ectransfer.dtype_name(np.int64) == "int64"
    with pytest.raises(ectransfer.Error, match="no torch counterpart"):
        ectransfer.dtype_name(np.dtype("U4"))


def test_use_after_close_raises_never_crashes():
    p = ectransfer.PushProducer({"ec_buffer_size": 1 << 20})
    p.close()
    p.close()  # idempotent
    for call in (p.flush, p.pending, lambda: p.poll(0), p.stats,
                 lambda: p.push("t", "127.0.0.1:1", "h", b"abcd")):
        with pytest.raises(ectransfer.Error) as ei:
            call()
        assert ei.value.code == ectransfer.ECT_ECLOSED
    s = ectransfer.PushScheduler({"ec_port": 1})
    with s:
        pass
    with pytest.raises(ectransfer.Error, match="closed"):
        s.poll()


def test_library_logs_reach_python_logging(caplog):
    # A push to a port nobody listens on: the producer logs the consumer as unreachable.
    caplog.set_level(logging.WARNING, logger="ectransfer")
    assert ectransfer.get_log_level() in ("warn", "error", "info", "debug")
    ectransfer.set_log_level("warn")
    with ectransfer.PushProducer({"ec_buffer_size": 1 << 20, "control_timeout_s": 5}) as p:
        import socket

        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        p.push("unreachable-1", f"127.0.0.1:{port}", "h1", bytearray(64))
        p.flush()
        (r,) = p.poll(timeout=60)
        assert not r.ok and not r.cancelled and r.error
    recs = [r for r in caplog.records if r.name.startswith("ectransfer.")]
    assert any("unreachable" in r.getMessage() for r in recs), [r.getMessage() for r in recs]
    rec = next(r for r in recs if "unreachable" in r.getMessage())
    assert rec.levelno == logging.WARNING
    assert rec.ect_thread_id > 0 and rec.ect_time_ns > 0
    ectransfer.set_log_level(None)
    with pytest.raises(ectransfer.Error):
        ectransfer.set_log_level("loud")


def test_configs_that_are_not_json_raise_errors():
    with pytest.raises(ectransfer.Error, match="not JSON-encodable"):
        ectransfer.PushProducer({"ec_buffer_size": object()})
    with pytest.raises(ectransfer.Error, match="not valid JSON"):
        ectransfer.PushConsumer("{ec_port: 1")
    with pytest.raises(ectransfer.Error, match="not valid JSON"):
        ectransfer.PushScheduler("{ec_port: 1")
    with pytest.raises(ectransfer.Error, match="must be a dict"):
        ectransfer.PushConsumer([("ec_port", 0)])
