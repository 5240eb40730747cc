/*
 * id — random identifiers: 32 lowercase hex digits (128 bits, the shape of a
 * Python uuid4().hex), and 64-bit random tokens for region keys. Both come
 * from getrandom(2); if that ever fails we fall back to a seeded xorshift so a
 * caller never gets an error for an id.
 *
 * The bytes are drawn from getrandom in bulk into a buffer per thread
 * (issue 13: one syscall per reservation id and per window key was ~2 % of a
 * small item's CPU). They are the kernel's random bytes, only fetched ahead:
 * ids stay as unguessable as before (reservation ids and window keys are the
 * tokens writes are bound to, issue 15). Each byte is handed out once and
 * zeroed when taken. After fork the child must not hand out the bytes its
 * parent will also hand out: a pthread_atfork child handler bumps a
 * generation counter, and a thread whose buffer was filled in another
 * generation throws it away before drawing.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/random.h>

#include "util/util.h"

#define POOL_BYTES 512 /* 16 ids or 64 tokens per getrandom call */

typedef struct {
    unsigned char buf[POOL_BYTES];
    size_t pos; /* bytes before pos are taken (and zeroed) */
    unsigned gen;
    bool filled;
} rnd_pool;

static __thread rnd_pool tl_pool;
static atomic_uint fork_gen;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void after_fork_child(void) { atomic_fetch_add(&fork_gen, 1); }

static void register_atfork(void) { (void)pthread_atfork(NULL, NULL, after_fork_child); }

static uint64_t fallback_u64(void) {
    static atomic_uint_fast64_t state;
    uint64_t x = atomic_fetch_add(&state, 0x9E3779B97F4A7C15ull) + ect_now_ns();
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static void fill_random(void *buf, size_t n) {
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t r = getrandom(p, n, 0);
        if (r <= 0) {
            for (size_t i = 0; i < n; i++) p[i] = (unsigned char)fallback_u64();
            return;
        }
        p += r;
        n -= (size_t)r;
    }
}

/* n (<= POOL_BYTES) fresh random bytes from this thread's pool. */
static void take_random(void *out, size_t n) {
    pthread_once(&atfork_once, register_atfork);
    rnd_pool *pl = &tl_pool;
    unsigned gen = atomic_load_explicit(&fork_gen, memory_order_relaxed);
    if (!pl->filled || pl->gen != gen || POOL_BYTES - pl->pos < n) {
        fill_random(pl->buf, POOL_BYTES);
        pl->pos = 0;
        pl->gen = gen;
        pl->filled = true;
    }
    memcpy(out, pl->buf + pl->pos, n);
    memset(pl->buf + pl->pos, 0, n);
    pl->pos += n;
}

void ect_random_id(char out[ECT_ID_LEN + 1]) {
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[ECT_ID_LEN / 2];
    take_random(raw, sizeof raw);
    for (size_t i = 0; i < sizeof raw; i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 15];
    }
    out[ECT_ID_LEN] = '\0';
}

uint64_t ect_random_u64(void) {
    uint64_t v;
    take_random(&v, sizeof v);
    return v;
}
