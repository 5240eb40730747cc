"""Push protocol from Python: tensors in and out, bit-exact, and every misuse raising."""

import gc
import threading

import pytest

import ectransfer
from conftest import wait_for

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

MiB = 1 << 20


@pytest.fixture
def inst():
    """A consumer instance (one shard, its scheduler) and a producer."""
    with ectransfer.PushConsumer({"ec_port": 0, "ec_buffer_size": 64 * MiB}) as shard:
        cfg = {"ec_port": shard.port, "push_wait_timeout_s": 120, "control_timeout_s": 60}
        with ectransfer.PushScheduler(cfg) as sched, ectransfer.PushProducer(
            {"ec_buffer_size": 64 * MiB, "control_timeout_s": 60}
        ) as prod:
            wait_for(lambda: sched.stats()["shards"] == 1, "discovery")
            yield shard, sched, prod


_n = [0]


def move(inst, src, mm_hash=None, **kw):
    """Pushes src, waits until it arrived on the shard, returns its transfer id."""
    shard, sched, prod = inst
    _n[0] += 1
    tid = f"t{_n[0]}"
    sched.expect(tid)
    prod.push(tid, shard.address, mm_hash or f"h{_n[0]}", src, **kw)
    assert prod.flush() == 1
    (r,) = wait_for(lambda: prod.poll(0), "result")
    assert r.ok, r
    assert r.transfer_id == tid and r.shards == 1 and r.transport == "tcp"
    wait_for(lambda: tid in sched.poll() or sched.state(tid).state == "LOADING", "arrival")
    return tid



def test_flush_poll_runs_a_lone_step_and_returns_its_result(inst):
    """flush_poll hands the step over and waits for it in one call; the result is
    the item's own, its bytes land, and a flush_poll with nothing queued hands over
    nothing and returns no result."""
    shard, sched, prod = inst
    src = rand_tensor((16, 64), torch.float32, seed=7)
    sched.expect("fp1")
    prod.push("fp1", shard.address, "hfp1", src)
    n, results = prod.flush_poll(30)
    if not results:
        results = wait_for(lambda: prod.poll(0), "result")
    assert n == 1
    (r,) = results
    assert r.ok and r.transfer_id == "fp1", r
    wait_for(lambda: "fp1" in sched.poll() or sched.state("fp1").state == "LOADING", "arrival")
    t = shard.take("fp1")
    assert torch.equal(t, src)
    shard.release("fp1")
    assert prod.flush_poll(0) == (0, [])


def rand_tensor(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=torch.float32).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, generator=g).to(dtype)


DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_torch_roundtrip_is_bit_exact(inst, dtype):
    shard = inst[0]
    x = rand_tensor((57, 33), dtype, seed=7)
    tid = move(inst, x)
    t = shard.take(tid)
    assert isinstance(t, torch.Tensor)
    assert t.dtype == dtype and tuple(t.shape) == (57, 33)
    assert torch.equal(t.view(torch.uint8) if dtype != torch.bool else t, x.view(torch.uint8) if dtype != torch.bool else x)
    assert bytes(t.numpy().tobytes() if dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes()) == bytes(
        x.numpy().tobytes() if dtype != torch.bfloat16 else x.view(torch.int16).numpy().tobytes())
    shard.release(tid)


def test_float8_maps_to_torch_or_refuses_clearly(inst):
    shard = inst[0]
    raw = np.arange(256, dtype=np.uint8).reshape(16, 16)
    tid = move(inst, raw, dtype="float8_e4m3fn", shape=(16, 16))
    f8 = getattr(torch, "float8_e4m3fn", None)
    if f8 is not None:
        t = shard.take(tid)
        assert t.dtype == f8 and tuple(t.shape) == (16, 16)
        assert bytes(t.view(torch.uint8).numpy().tobytes()) == raw.tobytes()
    else:
        with pytest.raises(ectransfer.Error) as ei:
            shard.take(tid)
        assert ei.value.code == ectransfer.ECT_ENOTSUP and "raw=True" in str(ei.value)
        t = shard.take(tid, raw=True)
        assert t.dtype == torch.uint8 and bytes(t.numpy().tobytes()) == raw.tobytes()
    shard.release(tid)


def test_numpy_in_and_out(inst):
    shard = inst[0]
    a = np.random.default_rng(1).standard_normal((20, 30)).astype(np.float32)
    tid = move(inst, a)
    v = shard.take(tid, out="numpy")
    assert isinstance(v, np.ndarray) and v.dtype == np.float32 and v.shape == (20, 30)
    assert np.array_equal(v, a)
    assert not v.flags.writeable
    shard.release(tid)
    # numpy has no bfloat16: its raw bytes, each element's two bytes on a new last axis
    x = rand_tensor((5, 7), torch.bfloat16, seed=3)
    tid = move(inst, x)
    v = shard.take(tid, out="numpy")
    assert v.dtype == np.uint8 and v.shape == (5, 7, 2)
    assert v.tobytes() == x.view(torch.int16).numpy().tobytes()
    assert np.array_equal(v.view("<u2")[..., 0], x.view(torch.int16).numpy().view(np.uint16))
    shard.release(tid)


def test_buffers_in(inst):
    shard = inst[0]
    tid = move(inst, b"0123456789abcdef")  # read-only bytes: uint8, shape (16,)
    t = shard.take(tid)
    assert t.dtype == torch.uint8 and bytes(t.numpy()) == b"0123456789abcdef"
    shard.release(tid)
    mv = memoryview(np.arange(12, dtype=np.int32).reshape(3, 4))
    tid = move(inst, mv)
    t = shard.take(tid)
    assert t.dtype == torch.int32 and tuple(t.shape) == (3, 4) and t[2, 3].item() == 11
    shard.release(tid)
    tid = move(inst, bytearray(b"\x01\x00" * 6), dtype="bfloat16", shape=(2, 3))
    t = shard.take(tid)
    assert t.dtype == torch.bfloat16 and tuple(t.shape) == (2, 3)
    shard.release(tid)


def test_non_contiguous_and_scalar_sources(inst):
    shard = inst[0]
    x = rand_tensor((8, 6), torch.float32, seed=9).t()  # transposed: not contiguous
    tid = move(inst, x)
    t = shard.take(tid)
    assert tuple(t.shape) == (6, 8) and torch.equal(t, x)
    shard.release(tid)
    tid = move(inst, torch.tensor(3.5))
    t = shard.take(tid)
    assert t.shape == () and t.item() == 3.5
    shard.release(tid)


def test_release_semantics_views_never_dangle(inst):
    shard, sched, prod = inst
    x = rand_tensor((256, 1024), torch.float32, seed=11)  # 1 MiB
    tid = move(inst, x)
    t = shard.take(tid)
    row = t[5]  # a view sharing the memory, made before release
    shard.release(tid)
    # the tensor take returned is emptied in place: code still holding it fails loudly
    assert t.shape == (0,) and t.numel() == 0
    with pytest.raises(IndexError):
        t[0]
    with pytest.raises(RuntimeError):
        t.view(256, 1024)
    with pytest.raises(ectransfer.Error) as ei:
        shard.release(tid)
    assert ei.value.code == ectransfer.ECT_ENOTFOUND
    # release ended the transfer on the shard at once...
    assert shard.stats()["finished"] == 1 and shard.stats()["live"] == 0
    with pytest.raises(ectransfer.Error) as ei:
        shard.take(tid)
    assert ei.value.code == ectransfer.ECT_ENOTFOUND
    # ...but the derived view still holds the lease: the bytes cannot be reclaimed
    assert shard.evict() == 0
    # fill the pool with other items, forcing reuse of any free memory
    for i in range(80):
        t2 = move(inst, rand_tensor((256, 1024), torch.float32, seed=100 + i))
        shard.take(t2)
        shard.release(t2)
        sched.loaded(t2)
        sched.cancel(t2)
    assert torch.equal(row, x[5])  # never overwritten
    shard.evict()  # every other item (none leased)
    assert shard.stats()["resident"] == 1  # ours, leased by row
    del row
    gc.collect()
    assert shard.evict() == 1  # the lease came back with row


def test_views_outlive_the_consumer_without_faulting():
    with ectransfer.PushConsumer({"ec_port": 0, "ec_buffer_size": 8 * MiB}) as shard:
        with ectransfer.PushScheduler({"ec_port": shard.port}) as sched, \
                ectransfer.PushProducer({"ec_buffer_size": 8 * MiB}) as prod:
            wait_for(lambda: sched.stats()["shards"] == 1, "discovery")
            x = rand_tensor((64, 64), torch.float64, seed=5)
            move((shard, sched, prod), x, mm_hash="outlive")
            tid = f"t{_n[0]}"
            t = shard.take(tid)
            a = shard.take(tid, out="numpy")
            part = t[1:3]
    # the consumer is closed, its ports and mapping gone; our views are still mapped
    assert shard.closed
    assert t.shape == (0,)  # emptied at close like at release
    assert torch.equal(part, x[1:3])
    assert np.array_equal(a, x.numpy())
    with pytest.raises(ectransfer.Error) as ei:
        shard.take(tid)
    assert ei.value.code == ectransfer.ECT_ECLOSED


def test_memoryview_out_is_released(inst):
    shard = inst[0]
    tid = move(inst, b"xyz" * 100)
    mv = shard.take(tid, out="memoryview")
    assert bytes(mv[:3]) == b"xyz"
    shard.release(tid)
    with pytest.raises(ValueError):
        mv[0]


def test_take_errors(inst):
    shard, sched, prod = inst
    with pytest.raises(ectransfer.Error) as ei:
        shard.take("never-pushed")
    assert ei.value.code == ectransfer.ECT_ENOTFOUND
    with pytest.raises(ectransfer.Error):
        shard.take(42)  # not a str
    tid = move(inst, b"abc")
    with pytest.raises(ectransfer.Error, match="out="):
        shard.take(tid, out="pandas")
    assert shard.taken() == []  # a refused take leaves nothing taken
    a, b = shard.take(tid), shard.take(tid)  # two takes, two leases
    assert shard.taken() == [tid]
    shard.release(tid)  # ends both
    assert a.numel() == 0 and b.numel() == 0


def test_push_errors(inst):
    shard, sched, prod = inst
    with pytest.raises(ectransfer.Error, match="numpy dtype object"):
        prod.push("e1", shard.address, "h", np.array([object()]))
    with pytest.raises(ectransfer.Error, match="cannot push a str"):
        prod.push("e1", shard.address, "h", "text")
    with pytest.raises(ectransfer.Error, match="is 8 bytes, the source holds 6"):
        prod.push("e1", shard.address, "h", bytearray(6), dtype="float32", shape=(2,))
    if hasattr(torch, "quint8"):
        with pytest.raises(ectransfer.Error, match="quint8"):
            prod.push("e1", shard.address, "h", torch.quantize_per_tensor(
                torch.ones(2), 1.0, 0, torch.quint8))
    with pytest.raises(ectransfer.Error, match="consumer"):
        prod.push("e1", "no-port", "h", b"ab")
    with pytest.raises(ectransfer.Error) as ei:
        prod.push("e1", shard.address, "", b"ab")
    assert ei.value.code == ectransfer.ECT_EINVAL and "mm_hash" in str(ei.value)
    prod.push("dup", shard.address, "hd", b"ab")
    with pytest.raises(ectransfer.Error) as ei:
        prod.push("dup", shard.address, "hd", b"ab")
    assert ei.value.code == ectransfer.ECT_EEXIST
    assert prod.cancel("dup") and not prod.cancel("dup")
    (r,) = prod.poll(timeout=10)
    assert r.cancelled and not r.ok and r.code == ectransfer.ECT_ECANCELED
    assert prod.poll() == []  # nothing pending: returns at once


def test_reserve_then_stage_and_scheduler_states(inst):
    shard, sched, prod = inst
    x = rand_tensor((4, 8), torch.float16, seed=2)
    sched.expect("rs1", "hr1")
    st = sched.state("rs1")
    assert st.state == "WAITING_EVENT" and not st.arrived
    assert not sched.is_ready("rs1")
    prod.reserve("rs1", "tcp://" + shard.address, "hr1", (4, 8), torch.float16)
    prod.flush()
    with pytest.raises(ectransfer.Error) as ei:
        prod.stage("rs1", x[:2])
    assert ei.value.code == ectransfer.ECT_EINVAL
    prod.stage("rs1", x)
    prod.flush()
    (r,) = prod.poll(timeout=60)
    assert r.ok
    wait_for(lambda: sched.is_ready("rs1"), "arrival")
    assert sched.poll() == ["rs1"]
    st = sched.state("rs1")
    assert st.state == "LOADING" and st.mm_hash == "hr1" and st.shape == (4, 8)
    assert torch.equal(shard.take("rs1"), x)
    shard.release("rs1")
    sched.loaded("rs1")
    assert sched.state("rs1").state == "RESIDENT"
    assert sched.cancel("rs1")
    assert not sched.cancel("nobody-knows")
    assert sched.state("nobody-knows") is None


def test_scheduler_poll_with_timeout_sleeps_until_the_item_lands(inst):
    shard, sched, prod = inst
    with pytest.raises(ValueError):
        sched.poll(timeout=-1)
    sched.expect("pw1")
    assert sched.poll(timeout=0) == []
    x = rand_tensor((16, 16), torch.float32, seed=5)
    done = []

    def push_later():
        prod.push("pw1", shard.address, "hpw1", x)
        prod.flush()
        done.extend(prod.poll(timeout=60))

    t = threading.Thread(target=push_later)
    t.start()
    got = []
    while not got:  # each call sleeps until an event (or the scheduler's recheck) wakes it
        got = sched.poll(timeout=600)
    t.join()
    assert got == ["pw1"] and done and done[0].ok
    assert torch.equal(shard.take("pw1"), x)
    shard.release("pw1")


def test_a_cancelled_transfer_is_refused_to_the_producer(inst):
    shard, sched, prod = inst
    sched.expect("c1", "hc1")
    assert sched.cancel("c1")  # the request went away before the push
    # poll() collects what the background thread's cancels got back
    wait_for(lambda: sched.poll() == [] and sched.stats()["cancels_sent"] >= 1,
             "the cancel to reach the shard")
    prod.push("c1", shard.address, "hc1", b"late")
    prod.flush()
    (r,) = prod.poll(timeout=60)
    assert r.cancelled and not r.ok


def test_dedup_moves_no_bytes(inst):
    shard, sched, prod = inst
    x = rand_tensor((128, 128), torch.bfloat16, seed=4)
    t1 = move(inst, x, mm_hash="same")
    shard.take(t1)
    shard.release(t1)
    sched.loaded(t1)
    sched.expect("again")
    prod.push("again", shard.address, "same", x)
    prod.flush()
    (r,) = prod.poll(timeout=60)
    assert r.ok and r.transport == ""  # answered from the resident copy
    wait_for(lambda: sched.is_ready("again"), "arrival")
    assert torch.equal(shard.take("again"), x)
    shard.release("again")


def test_producer_from_many_threads(inst):
    shard, sched, prod = inst
    n = 32
    xs = [rand_tensor((64, 64), torch.float32, seed=1000 + i) for i in range(n)]
    for i in range(n):
        sched.expect(f"mt{i}")
    errors = []

    def work(k):
        try:
            for i in range(k, n, 4):
                prod.push(f"mt{i}", shard.address, f"hmt{i}", xs[i])
                prod.flush()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    ths = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    assert not errors
    done = []
    wait_for(lambda: done.extend(prod.poll(0)) or len(done) == n, "every result")
    assert all(r.ok for r in done)
    arrived = set()
    wait_for(lambda: arrived.update(sched.poll()) or len(arrived) == n, "every arrival")
    for i in range(n):
        assert torch.equal(shard.take(f"mt{i}"), xs[i])
        shard.release(f"mt{i}")


def test_a_refused_take_gives_back_only_its_own_lease(inst):
    shard, sched, prod = inst
    x = rand_tensor((64, 64), torch.float32, seed=21)
    tid = move(inst, x)
    t = shard.take(tid)  # one lease
    with pytest.raises(ectransfer.Error, match="out="):
        shard.take(tid, out="pandas")  # took a second lease, must give back exactly that one
    sched.loaded(tid)
    before = sched.stats()["cancels_sent"]
    sched.cancel(tid)  # the reservation goes: only the lease keeps the bytes now
    wait_for(lambda: sched.poll() == [] and sched.stats()["cancels_sent"] > before,
             "the cancel to reach the shard")
    assert shard.evict() == 0  # still leased by t
    assert torch.equal(t, x)
    del t
    gc.collect()
    assert shard.evict() == 1  # the lease came back with t
    assert shard.taken() == []  # and nothing is listed as taken any more


def test_views_dying_give_back_leases_only(inst):
    """A view collected (or a take refused) returns its lease and nothing else: the
    transfer stays delivered and can be taken again until release()."""
    shard, sched, prod = inst
    x = rand_tensor((32, 32), torch.float32, seed=31)
    tid = move(inst, x)
    t = shard.take(tid)
    del t
    gc.collect()
    assert shard.stats()["live"] == 1 and shard.stats()["finished"] == 0
    with pytest.raises(ectransfer.Error, match="out="):
        shard.take(tid, out="pandas")
    a = shard.take(tid)
    b = shard.take(tid, out="numpy")
    assert torch.equal(a, x) and np.array_equal(b, x.numpy())
    del a, b
    gc.collect()
    assert shard.taken() == []
    # release() after every view died still ends the transfer
    shard.release(tid)
    assert shard.stats()["finished"] == 1 and shard.stats()["live"] == 0
    with pytest.raises(ectransfer.Error) as ei:
        shard.take(tid)
    assert ei.value.code == ectransfer.ECT_ENOTFOUND
    assert shard.evict() == 1  # no lease left, resident for dedup until now


def test_finish_without_take(inst):
    shard, sched, prod = inst
    tid = move(inst, b"held elsewhere")
    assert shard.finish(tid)  # the engine already had the content
    assert not shard.finish(tid)  # ended already
    assert not shard.finish("never-pushed")
    assert shard.stats()["finished"] == 1 and shard.stats()["live"] == 0
    with pytest.raises(ectransfer.Error) as ei:
        shard.take(tid)
    assert ei.value.code == ectransfer.ECT_ENOTFOUND
    with pytest.raises(ectransfer.Error) as ei:
        shard.release(tid)  # nothing was taken
    assert ei.value.code == ectransfer.ECT_ENOTFOUND
