"""Pull protocol from Python: save, learn, load zero-copy, release."""

import pytest

import ectransfer
from conftest import wait_for

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

MiB = 1 << 20


@pytest.fixture
def pull():
    with ectransfer.PullProducer({"ec_port": 0, "ec_buffer_size": 32 * MiB}) as prod:
        cfg = {"ec_port": prod.port, "ec_buffer_size": 32 * MiB}
        with ectransfer.PullScheduler({"ec_port": prod.port}) as sched, \
                ectransfer.PullConsumer(cfg) as cons:
            yield prod, sched, cons


def test_save_has_load_release(pull):
    prod, sched, cons = pull
    x = torch.randn(576, 64, dtype=torch.float32).to(torch.bfloat16)
    prod.save("img-1", x)
    prod.flush()
    meta = wait_for(lambda: sched.has("img-1"), "the notification")
    assert meta.shape == (576, 64) and meta.dtype.endswith("bfloat16")
    assert meta.nbytes == x.numel() * 2 and meta.producer_session_id == prod.session_id
    assert sched.has("img-2") is None
    t = cons.load("img-1", meta)
    assert t.dtype == torch.bfloat16 and torch.equal(t, x)
    d = t[3]
    cons.release("img-1")
    assert t.numel() == 0 and torch.equal(d, x[3])
    with pytest.raises(ectransfer.Error) as ei:
        cons.release("img-1")
    assert ei.value.code == ectransfer.ECT_ENOTFOUND
    # a second load is answered by the consumer's own pool
    t2 = cons.load("img-1", meta)
    assert torch.equal(t2, x)
    assert cons.stats()["local"] == 1 and cons.stats()["remote"] == 1
    cons.release("img-1")
    assert "img-1" in sched.available()
    assert prod.stats()["saved"] == 1


def test_numpy_and_errors(pull):
    prod, sched, cons = pull
    a = np.arange(24, dtype=np.int16).reshape(2, 3, 4)
    prod.save("np", a)
    prod.flush()
    meta = wait_for(lambda: sched.has("np"), "the notification")
    v = cons.load("np", meta, out="numpy")
    assert v.dtype == np.int16 and np.array_equal(v, a)
    cons.release("np")
    with pytest.raises(ectransfer.Error, match="Meta"):
        cons.load("np", {"nbytes": 48})
    gone = ectransfer.Meta("missing", 16, (16,), "uint8", meta.producer_session_id)
    with pytest.raises(ectransfer.Error) as ei:
        cons.load("missing", gone)
    assert ei.value.code == ectransfer.ECT_ENOTFOUND
    sched.forget("np")
    prod.close()
    with pytest.raises(ectransfer.Error) as ei:
        prod.save("late", a)
    assert ei.value.code == ectransfer.ECT_ECLOSED
