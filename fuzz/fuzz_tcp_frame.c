/*
 * fuzz_tcp_frame — the tcp target's receive state machine (tcp_frame.c) fed
 * arbitrary bytes, in arbitrary chunk sizes, exactly as the connection loop
 * feeds it from recv(): want -> copy into the place it names -> advance.
 * One region of 4 KiB is registered at the fixed address 0x10000000 with
 * key 0x1122334455667788, so seeds can carry writes that land, and others
 * that are refused for their key or range. Acks are "sent" by dropping them.
 * A second region of 4 KiB at 0x10010000 (key 0x99aabbccddeeff00) is marked
 * CUDA memory, so its writes go through the device sink: here a stand-in
 * whose slots are 100 bytes (many slices per write), whose copies are a
 * memcpy checked to stay inside the region, and which fails a slice whose
 * first byte is 0xEE (the write must then be refused, the rest discarded).
 */
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "util/util.h"
#include "xport/tcp_frame.h"
#include "xport/xport.h"

#define FZ_ADDR 0x10000000ul
#define FZ_LEN 4096
#define FZ_KEY 0x1122334455667788ull
#define FZ_DADDR 0x10010000ul
#define FZ_DKEY 0x99aabbccddeeff00ull
#define FZ_SLOT 100

static xp_regions regs;
static xp_region region, dregion;

typedef struct sink {
    uint8_t slot[FZ_SLOT];
    int pending_err;
    int in_slot; /* a slot was handed out and not yet submitted */
} sink;

static int s_slot(void *ctx, int device, uint8_t **ptr, size_t *cap) {
    sink *k = ctx;
    if (device != 0 || k->in_slot) __builtin_trap();
    k->in_slot = 1;
    *ptr = k->slot;
    *cap = FZ_SLOT;
    return 0;
}

static int s_submit(void *ctx, uint8_t *dst, size_t n) {
    sink *k = ctx;
    if (!k->in_slot || n == 0 || n > FZ_SLOT) __builtin_trap();
    k->in_slot = 0;
    if ((uintptr_t)dst < FZ_DADDR || (uintptr_t)dst + n > FZ_DADDR + FZ_LEN) __builtin_trap();
    if (k->slot[0] == 0xEE) {
        k->pending_err = ECT_EIO;
        return ect_set_error(ECT_EIO, "fuzz: device copy failed");
    }
    memcpy(dst, k->slot, n);
    return 0;
}

static int s_drain(void *ctx) {
    sink *k = ctx;
    int e = k->pending_err;
    k->pending_err = 0;
    return e;
}

static const tcp_rx_dev_ops sink_ops = {s_slot, s_submit, s_drain};

static void setup(void) {
    static int done;
    if (done) return;
    done = 1;
    void *a = mmap((void *)FZ_ADDR, FZ_LEN, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (a != (void *)FZ_ADDR) __builtin_trap();
    pthread_mutex_init(&regs.mu, NULL);
    pthread_cond_init(&regs.cv, NULL);
    region.token = FZ_KEY;
    region.id = 1;
    region.addr = a;
    region.len = FZ_LEN;
    region.fd = -1;
    HASH_ADD(hh, regs.by_token, token, sizeof region.token, &region);
    void *d = mmap((void *)FZ_DADDR, FZ_LEN, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (d != (void *)FZ_DADDR) __builtin_trap();
    dregion.token = FZ_DKEY;
    dregion.id = 2;
    dregion.addr = d;
    dregion.len = FZ_LEN;
    dregion.fd = -1;
    dregion.kind = ECT_MEM_CUDA;
    HASH_ADD(hh, regs.by_token, token, sizeof dregion.token, &dregion);
    ect_log_set_level(ECT_LOG_ERROR);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    if (size < 1) return 0;
    /* The first byte sets the largest chunk one "recv" may return. */
    size_t chunk = (size_t)data[0] % 64 + 1;
    if (data[0] >= 192) chunk = SIZE_MAX;
    data++;
    size--;
    tcp_rx rx;
    sink k = {0};
    if (tcp_rx_init(&rx, &regs) != 0) return 0;
    rx.dev = &sink_ops;
    rx.dev_ctx = &k;
    while (size > 0) {
        void *p;
        size_t want = tcp_rx_want(&rx, &p);
        if (want == 0) {
            if (rx.state == TCP_RX_DEAD) break;
            rx.out_len = 0; /* flushed */
            continue;
        }
        size_t n = want < size ? want : size;
        if (n > chunk) n = chunk;
        memcpy(p, data, n);
        data += n;
        size -= n;
        if (tcp_rx_advance(&rx, n) != 0) break;
        if (rx.out_len > TCP_RX_OUT_CAP) __builtin_trap();
    }
    tcp_rx_fini(&rx);
    if (region.refs != 0 || dregion.refs != 0) __builtin_trap(); /* every reference released */
    return 0;
}
