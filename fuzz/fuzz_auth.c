/*
 * fuzz_auth — the data-plane handshake (xport/auth.c): the frame decoder and
 * both sides of the exchange fed a peer's arbitrary bytes.
 *
 * Input: byte 0 picks the mode (mod 3), byte 1 holds options, the rest is
 * what the peer "sends", consumed XP_AUTH_LEN bytes per receive (a short
 * remainder is a peer that hung up):
 *   0  the decoder alone on the rest (any length);
 *   1  the target side: the rest holds the initiator's RESPONSE; with
 *      option bit 0 its key field is overwritten with the one initiator key
 *      the target accepts, so the proof check runs;
 *   2  the initiator side: the rest holds the target's CHALLENGE and RESULT;
 *      with option bit 0 the CHALLENGE's key field is overwritten with the
 *      accepted target key, so the initiator answers and checks the RESULT.
 * The two key pairs are fixed (seeded), the nonces random as in service.
 *
 * Invariants beyond "no crash, no sanitizer report": a decoded frame
 * encodes back to the same bytes (reserved bytes 12..15 read as 0); a
 * refusal is ECT_EPROTO, ECT_EACCES or ECT_ECLOSED with a detail; and no
 * input completes a handshake (a forged peer would need the secret key
 * behind an accepted public key, or a fresh nonce it cannot see).
 */
#include <sodium.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/keys.h"
#include "util/util.h"
#include "xport/auth.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct feed {
    uint8_t *buf;
    size_t len, off;
    int patch_first; /* overwrite the key of the first frame received */
    const uint8_t *patch_key;
} feed;

static int f_send(void *ctx, const uint8_t *b, size_t n) {
    (void)ctx;
    if (n != XP_AUTH_LEN) __builtin_trap();
    xp_auth_frame f;
    if (xp_auth_decode(b, n, &f) != 0) __builtin_trap(); /* we only send valid frames */
    return 0;
}

static int f_recv(void *ctx, uint8_t *b, size_t n) {
    feed *f = ctx;
    if (f->len - f->off < n) return ect_set_error(ECT_ECLOSED, "fuzz: the peer hung up");
    memcpy(b, f->buf + f->off, n);
    if (f->off == 0 && f->patch_first && n >= 48) memcpy(b + 16, f->patch_key, ECT_KEY_BYTES);
    f->off += n;
    return 0;
}

static ect_keyset *fixed_set(uint8_t seed, const uint8_t accept[ECT_KEY_BYTES]) {
    ect_keyset *ks = calloc(1, sizeof *ks);
    uint8_t s[crypto_box_SEEDBYTES];
    memset(s, seed, sizeof s);
    crypto_box_seed_keypair(ks->pub, ks->sec, s);
    ks->n_accept = 1;
    ks->accept = calloc(1, sizeof *ks->accept);
    ks->accept_z85 = calloc(1, sizeof *ks->accept_z85);
    ks->accept_names = calloc(1, sizeof *ks->accept_names);
    ks->accept_names[0] = strdup("peer");
    ks->dir = strdup("fuzz");
    memcpy(ks->accept[0], accept, ECT_KEY_BYTES);
    ect_key_z85(ks->pub, ks->pub_z85);
    return ks;
}

static ect_keyset *tset, *iset;

static void refused(int rc) {
    if ((rc != ECT_EPROTO && rc != ECT_EACCES && rc != ECT_ECLOSED) || !ect_last_error()[0])
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tset) {
        ect_log_set_level(ECT_LOG_ERROR);
        if (xp_auth_init() != 0) __builtin_trap();
        uint8_t tpub[ECT_KEY_BYTES], ipub[ECT_KEY_BYTES], sk[ECT_KEY_BYTES], s[32];
        memset(s, 0x11, sizeof s);
        crypto_box_seed_keypair(tpub, sk, s);
        memset(s, 0x22, sizeof s);
        crypto_box_seed_keypair(ipub, sk, s);
        tset = fixed_set(0x11, ipub);
        iset = fixed_set(0x22, tpub);
    }
    if (size < 2) return 0;
    int mode = data[0] % 3;
    feed f = {.buf = malloc(size - 2 + 1), .len = size - 2, .patch_first = data[1] & 1};
    if (!f.buf) return 0;
    memcpy(f.buf, data + 2, size - 2);
    xp_auth_io io = {f_send, f_recv, &f};
    int rc, peer;
    switch (mode) {
    case 0: {
        xp_auth_frame fr;
        rc = xp_auth_decode(f.buf, f.len, &fr);
        if (rc) {
            refused(rc);
            break;
        }
        uint8_t out[XP_AUTH_LEN], want[XP_AUTH_LEN];
        xp_auth_encode(out, &fr);
        memcpy(want, f.buf, XP_AUTH_LEN);
        memset(want + 12, 0, 4);
        if (memcmp(out, want, XP_AUTH_LEN) != 0) __builtin_trap();
        break;
    }
    case 1:
        f.patch_key = iset->pub;
        rc = xp_auth_target(tset, &io, &peer);
        if (rc == 0) __builtin_trap(); /* a forged initiator got in */
        refused(rc);
        break;
    default:
        f.patch_key = tset->pub;
        rc = xp_auth_initiator(iset, &io, "fuzz");
        if (rc == 0) __builtin_trap(); /* a forged target was believed */
        refused(rc);
    }
    free(f.buf);
    return 0;
}
