/*
 * fuzz_tcp_frame — the tcp target's receive state machine (tcp_frame.c) fed
 * arbitrary bytes, in arbitrary chunk sizes, exactly as the connection loop
 * feeds it from recv(): want -> copy into the place it names -> advance.
 * One region of 4 KiB is registered at the fixed address 0x10000000 with
 * key 0x1122334455667788, so seeds can carry writes that land, and others
 * that are refused for their key or range. Acks are "sent" by dropping them.
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

static xp_regions regs;
static xp_region region;

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
    if (tcp_rx_init(&rx, &regs) != 0) return 0;
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
    if (region.refs != 0) __builtin_trap(); /* every reference released */
    return 0;
}
