/*
 * id — random identifiers: 32 lowercase hex digits (128 bits, the shape of a
 * Python uuid4().hex), and 64-bit random tokens for region keys. Both come
 * from getrandom(2); if that ever fails we fall back to a seeded xorshift so a
 * caller never gets an error for an id.
 */
#include <stdatomic.h>
#include <sys/random.h>

#include "util/util.h"

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

void ect_random_id(char out[ECT_ID_LEN + 1]) {
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[ECT_ID_LEN / 2];
    fill_random(raw, sizeof raw);
    for (size_t i = 0; i < sizeof raw; i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 15];
    }
    out[ECT_ID_LEN] = '\0';
}

uint64_t ect_random_u64(void) {
    uint64_t v;
    fill_random(&v, sizeof v);
    return v;
}
