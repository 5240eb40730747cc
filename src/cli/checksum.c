/* checksum — what the CLI tools compare items by, and the synthetic bytes
 * they move.
 *
 * cli_checksum: XXH3_64bits (XXH3, 64-bit, seed 0, default secret;
 * libxxhash) of every byte, printed by the CLI as 16 lowercase hex digits to
 * compare items across processes. XXH3 reads 64-byte stripes with SIMD;
 * where libxxhash exports XXH3_64bits_dispatch (x86: the variant for the
 * CPU's widest vectors, AVX2 / AVX-512) that is called, else the plain
 * XXH3_64bits (SSE2 on x86-64): the same value either way. 30 GB/s on a
 * 128 KiB item in cache here against 11.6 for the XXH64 it replaced (which
 * was 6-11 % of `ect demo`'s samples; docs/BENCHMARKS.md "The demo's own
 * cost").
 *
 * cli_fill_synthetic: a 64 KiB random block R (a splitmix64 stream of a
 * fixed seed, made once per process) and, per 4 KiB page p of the item, a
 * 64-bit key k_p = splitmix64 finalizer of (state + (p + 1) x golden ratio):
 * word w of page p is R[o_p + w] XOR k_p, o_p = (k_p >> 32) mod 8192 words,
 * little-endian; the last word is cut to the length. Every word of an item
 * differs from the same word of an item with another state (its page key
 * differs), so bytes left over from an earlier item, or landed at another
 * item's place, change the checksum; within an item, pages differ by their
 * key and offset and R does not repeat within a page, so a chunk moved
 * inside the item changes it too. One finalizer per 4 KiB and a vectorised
 * load-xor-store from a block that stays in cache: store speed, where the
 * splitmix64 word stream (two multiplies per 8 bytes) it replaced was 9 % of
 * `ect demo`'s samples.
 *
 * cli_fill_synthetic_checksum: both in one pass, 16 KiB at a time (filled,
 * then fed to XXH3's streaming state while in L1), the same bytes and the
 * same value as the two calls: a 4.5 MiB item no longer goes out to memory
 * and back between them (its checksum was 9 % of `ect demo`'s samples). */
#include <pthread.h>
#include <string.h>
#include <xxhash.h>

#include "cli/cli.h"

/* Weak: NULL when the library has no dispatcher (then XXH3_64bits). */
extern XXH64_hash_t XXH3_64bits_dispatch(const void *input, size_t len) __attribute__((weak));

uint64_t cli_checksum(const void *data, size_t n) {
    return (uint64_t)(XXH3_64bits_dispatch ? XXH3_64bits_dispatch(data, n) : XXH3_64bits(data, n));
}

#define GOLDEN 0x9e3779b97f4a7c15ull
#define PAGE_WORDS 512u       /* 4 KiB */
#define BLOCK_WORDS 8192u     /* 64 KiB: the offsets o_p range over it */
#define R_SEED 0x5eed0fec7ull /* R's splitmix64 seed: any fixed value */

static inline uint64_t splitmix64_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t le64(uint64_t v) {
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

/* R, little-endian words, one page longer than the offsets reach so that a
 * page is one contiguous run. */
static uint64_t rblock[BLOCK_WORDS + PAGE_WORDS];
static pthread_once_t rblock_once = PTHREAD_ONCE_INIT;

static void rblock_make(void) {
    for (uint32_t k = 0; k < BLOCK_WORDS + PAGE_WORDS; k++)
        rblock[k] = le64(splitmix64_mix(R_SEED + (k + 1) * GOLDEN));
}

/* words words of R from offset o, each XOR key (already in byte order),
 * into dst (any alignment). */
static void xor_run(unsigned char *dst, const uint64_t *src, uint64_t key, uint32_t words) {
    typedef uint64_t v4 __attribute__((vector_size(32)));
    v4 kv = {key, key, key, key};
    uint32_t w = 0;
    for (; w + 4 <= words; w += 4) {
        v4 x;
        memcpy(&x, src + w, sizeof x);
        x ^= kv;
        memcpy(dst + 8 * w, &x, sizeof x);
    }
    for (; w < words; w++) {
        uint64_t x = src[w] ^ key;
        memcpy(dst + 8 * w, &x, 8);
    }
}

/* Pages [p0, p1) of the n-byte item of `state` into b (the item's start). */
static void fill_pages(unsigned char *b, uint64_t n, uint64_t state, uint64_t p0, uint64_t p1) {
    uint64_t full = n / 8;
    for (uint64_t p = p0; p < p1 && p * PAGE_WORDS * 8 < n; p++) {
        uint64_t k = splitmix64_mix(state + (p + 1) * GOLDEN);
        const uint64_t *src = rblock + (k >> 32) % BLOCK_WORDS;
        uint64_t first = p * PAGE_WORDS, left = full - (first < full ? first : full);
        uint32_t run = (uint32_t)(left < PAGE_WORDS ? left : PAGE_WORDS);
        xor_run(b + 8 * first, src, le64(k), run);
        if (run < PAGE_WORDS && n % 8) { /* the last word, cut to the length */
            uint64_t last = src[run] ^ le64(k);
            memcpy(b + 8 * (first + run), &last, (size_t)(n % 8));
        }
    }
}

void cli_fill_synthetic(void *buf, uint64_t n, uint64_t state) {
    pthread_once(&rblock_once, rblock_make);
    fill_pages(buf, n, state, 0, (n + PAGE_WORDS * 8 - 1) / (PAGE_WORDS * 8));
}

/* Weak, as XXH3_64bits_dispatch above. */
extern XXH_errorcode XXH3_64bits_update_dispatch(XXH3_state_t *state, const void *input, size_t len)
    __attribute__((weak));

#define FUSED_PAGES 4u /* 16 KiB: filled, then hashed while in L1 */

uint64_t cli_fill_synthetic_checksum(void *buf, uint64_t n, uint64_t state) {
    const uint64_t chunk = FUSED_PAGES * PAGE_WORDS * 8;
    XXH3_state_t *st = n > chunk ? XXH3_createState() : NULL; /* one chunk: still in L1 */
    if (!st || XXH3_64bits_reset(st) != XXH_OK) {
        XXH3_freeState(st);
        cli_fill_synthetic(buf, n, state);
        return cli_checksum(buf, n);
    }
    pthread_once(&rblock_once, rblock_make);
    unsigned char *b = buf;
    for (uint64_t off = 0; off < n; off += chunk) {
        size_t len = (size_t)(n - off < chunk ? n - off : chunk);
        fill_pages(b, n, state, off / (PAGE_WORDS * 8), off / (PAGE_WORDS * 8) + FUSED_PAGES);
        if (XXH3_64bits_update_dispatch)
            XXH3_64bits_update_dispatch(st, b + off, len);
        else
            XXH3_64bits_update(st, b + off, len);
    }
    uint64_t h = (uint64_t)XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return h;
}
