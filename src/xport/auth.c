/*
 * auth — the data-plane handshake (auth.h has the protocol's outline,
 * docs/PROTOCOL.md its bytes).
 *
 * Key derivation, the same on both sides:
 *   s = crypto_scalarmult(own secret, peer public)       (X25519, 32 bytes)
 *   k = BLAKE2b-256(s || initiator public || target public)
 *   proof_I = BLAKE2b-256 keyed by k over "ECT auth initiator" || nonce_T || nonce_I
 *   proof_T = BLAKE2b-256 keyed by k over "ECT auth target   " || nonce_T || nonce_I
 * The labels differ so that one side's proof is never the other's; both
 * nonces are fresh random bytes per connection, so a recorded proof is worth
 * nothing on another connection. Proofs are compared in constant time.
 */
#include "xport/auth.h"

#include <pthread.h>
#include <sodium.h>
#include <string.h>

#include "util/util.h"
#include "xport/xport.h"

#define LABEL_LEN 18
static const char label_i[LABEL_LEN + 1] = "ECT auth initiator";
static const char label_t[LABEL_LEN + 1] = "ECT auth target   ";

static pthread_once_t sodium_once = PTHREAD_ONCE_INIT;
static int sodium_rc;

static void sodium_start(void) { sodium_rc = sodium_init() < 0 ? -1 : 0; }

int xp_auth_init(void) {
    pthread_once(&sodium_once, sodium_start);
    if (sodium_rc != 0) return ect_set_error(ECT_EIO, "libsodium failed to initialise");
    return 0;
}

void xp_auth_encode(uint8_t out[XP_AUTH_LEN], const xp_auth_frame *f) {
    memset(out, 0, XP_AUTH_LEN);
    xp_put_u32(out, XP_AUTH_MAGIC);
    xp_put_u16(out + 4, f->type);
    xp_put_u16(out + 6, XP_AUTH_VERSION);
    xp_put_u32(out + 8, f->verdict);
    memcpy(out + 16, f->key, ECT_KEY_BYTES);
    memcpy(out + 48, f->nonce, ECT_KEY_BYTES);
    memcpy(out + 80, f->proof, ECT_KEY_BYTES);
}

int xp_auth_decode(const uint8_t *b, size_t len, xp_auth_frame *f) {
    if (len != XP_AUTH_LEN)
        return ect_set_error(ECT_EPROTO, "auth frame: %zu bytes, expected %d", len, XP_AUTH_LEN);
    if (xp_get_u32(b) != XP_AUTH_MAGIC)
        return ect_set_error(ECT_EPROTO, "auth frame: bad magic 0x%08x", xp_get_u32(b));
    if (xp_get_u16(b + 6) != XP_AUTH_VERSION)
        return ect_set_error(ECT_EPROTO, "auth frame: version %u, this side speaks %d",
                             xp_get_u16(b + 6), XP_AUTH_VERSION);
    f->type = xp_get_u16(b + 4);
    if (f->type < XP_AUTH_CHALLENGE || f->type > XP_AUTH_RESULT)
        return ect_set_error(ECT_EPROTO, "auth frame: unknown type %u", f->type);
    f->verdict = xp_get_u32(b + 8);
    if (f->verdict > XP_AUTH_VERDICT_MAX)
        return ect_set_error(ECT_EPROTO, "auth frame: unknown verdict %u", f->verdict);
    memcpy(f->key, b + 16, ECT_KEY_BYTES);
    memcpy(f->nonce, b + 48, ECT_KEY_BYTES);
    memcpy(f->proof, b + 80, ECT_KEY_BYTES);
    return 0;
}

void xp_auth_encode_refusal(uint8_t out[XP_AUTH_LEN], uint32_t verdict) {
    xp_auth_frame f = {.type = XP_AUTH_RESULT, .verdict = verdict};
    xp_auth_encode(out, &f);
}

const char *xp_auth_verdict_str(uint32_t verdict) {
    switch (verdict) {
    case XP_AUTH_OK: return "accepted";
    case XP_AUTH_UNKNOWN_KEY: return "it does not accept our key";
    case XP_AUTH_BAD_PROOF: return "our proof was wrong";
    case XP_AUTH_NO_KEYS: return "it has no data-plane keys configured";
    case XP_AUTH_KEYS_REQUIRED: return "it requires data-plane keys (curve_keys)";
    default: return "unknown verdict";
    }
}

/* proof = BLAKE2b-256_k(label || nonce_t || nonce_i), k from the shared
 * secret of (own secret, peer public) and both public keys. -1 when the
 * peer's public key is degenerate (a low-order point: no shared secret). */
static int make_proof(const ect_keyset *ks, const uint8_t peer_pub[ECT_KEY_BYTES],
                      const uint8_t pub_i[ECT_KEY_BYTES], const uint8_t pub_t[ECT_KEY_BYTES],
                      const uint8_t nonce_t[ECT_KEY_BYTES], const uint8_t nonce_i[ECT_KEY_BYTES],
                      const char *label, uint8_t out[ECT_KEY_BYTES]) {
    uint8_t s[crypto_scalarmult_BYTES], k[32];
    if (crypto_scalarmult(s, ks->sec, peer_pub) != 0) return -1;
    crypto_generichash_state h;
    crypto_generichash_init(&h, NULL, 0, sizeof k);
    crypto_generichash_update(&h, s, sizeof s);
    crypto_generichash_update(&h, pub_i, ECT_KEY_BYTES);
    crypto_generichash_update(&h, pub_t, ECT_KEY_BYTES);
    crypto_generichash_final(&h, k, sizeof k);
    crypto_generichash_init(&h, k, sizeof k, ECT_KEY_BYTES);
    crypto_generichash_update(&h, (const uint8_t *)label, LABEL_LEN);
    crypto_generichash_update(&h, nonce_t, ECT_KEY_BYTES);
    crypto_generichash_update(&h, nonce_i, ECT_KEY_BYTES);
    crypto_generichash_final(&h, out, ECT_KEY_BYTES);
    sodium_memzero(s, sizeof s);
    sodium_memzero(k, sizeof k);
    return 0;
}

static int recv_frame(const xp_auth_io *io, xp_auth_frame *f) {
    uint8_t b[XP_AUTH_LEN];
    int rc = io->recv(io->ctx, b, sizeof b);
    if (rc) return rc;
    return xp_auth_decode(b, sizeof b, f);
}

static int send_frame(const xp_auth_io *io, const xp_auth_frame *f) {
    uint8_t b[XP_AUTH_LEN];
    xp_auth_encode(b, f);
    return io->send(io->ctx, b, sizeof b);
}

int xp_auth_target(const ect_keyset *ks, const xp_auth_io *io, int *peer) {
    *peer = -1;
    int rc = xp_auth_init();
    if (rc) return rc;
    xp_auth_frame ch = {.type = XP_AUTH_CHALLENGE};
    memcpy(ch.key, ks->pub, ECT_KEY_BYTES);
    randombytes_buf(ch.nonce, sizeof ch.nonce);
    if ((rc = send_frame(io, &ch)) != 0) return rc;
    xp_auth_frame r;
    if ((rc = recv_frame(io, &r)) != 0) return rc;
    if (r.type != XP_AUTH_RESPONSE)
        return ect_set_error(ECT_EPROTO, "auth: expected a RESPONSE frame, got type %u", r.type);
    if (r.verdict != XP_AUTH_OK)
        return ect_set_error(ECT_EACCES, "the initiator refused this target: %s",
                             r.verdict == XP_AUTH_UNKNOWN_KEY
                                 ? "it does not accept this target's key"
                                 : xp_auth_verdict_str(r.verdict));
    xp_auth_frame res = {.type = XP_AUTH_RESULT};
    char z85[ECT_KEY_Z85_LEN + 1];
    int idx = ect_keys_find(ks, r.key);
    uint8_t want[ECT_KEY_BYTES];
    if (idx < 0) {
        res.verdict = XP_AUTH_UNKNOWN_KEY;
        send_frame(io, &res);
        ect_key_z85(r.key, z85);
        return ect_set_error(ECT_EACCES,
                             "the initiator's key %s is not accepted (not in %s/accept/)", z85,
                             ks->dir ? ks->dir : "the key directory");
    }
    if (make_proof(ks, r.key, r.key, ks->pub, ch.nonce, r.nonce, label_i, want) != 0 ||
        sodium_memcmp(want, r.proof, sizeof want) != 0) {
        res.verdict = XP_AUTH_BAD_PROOF;
        send_frame(io, &res);
        return ect_set_error(ECT_EACCES,
                             "the initiator's proof for the key of \"%s\" is wrong (it does "
                             "not hold that key's secret)",
                             ks->accept_names[idx]);
    }
    memcpy(res.key, ks->pub, ECT_KEY_BYTES);
    make_proof(ks, r.key, r.key, ks->pub, ch.nonce, r.nonce, label_t, res.proof);
    if ((rc = send_frame(io, &res)) != 0) return rc;
    *peer = idx;
    return 0;
}

int xp_auth_initiator(const ect_keyset *ks, const xp_auth_io *io, const char *peer) {
    int rc = xp_auth_init();
    if (rc) return rc;
    xp_auth_frame ch;
    if ((rc = recv_frame(io, &ch)) != 0) return rc;
    if (ch.type == XP_AUTH_RESULT && ch.verdict != XP_AUTH_OK)
        return ect_set_error(ECT_EACCES, "the target %s refused the handshake: %s", peer,
                             xp_auth_verdict_str(ch.verdict));
    if (ch.type != XP_AUTH_CHALLENGE)
        return ect_set_error(ECT_EPROTO, "auth: expected a CHALLENGE from %s, got type %u", peer,
                             ch.type);
    xp_auth_frame r = {.type = XP_AUTH_RESPONSE};
    char z85[ECT_KEY_Z85_LEN + 1];
    if (!ect_keys_accepts(ks, ch.key)) {
        r.verdict = XP_AUTH_UNKNOWN_KEY;
        send_frame(io, &r);
        ect_key_z85(ch.key, z85);
        return ect_set_error(ECT_EACCES,
                             "the target's key is not accepted: %s presented %s, which is not "
                             "in %s/accept/",
                             peer, z85, ks->dir ? ks->dir : "the key directory");
    }
    memcpy(r.key, ks->pub, ECT_KEY_BYTES);
    randombytes_buf(r.nonce, sizeof r.nonce);
    if (make_proof(ks, ch.key, ks->pub, ch.key, ch.nonce, r.nonce, label_i, r.proof) != 0)
        return ect_set_error(ECT_EACCES, "the target %s presented a degenerate public key", peer);
    if ((rc = send_frame(io, &r)) != 0) return rc;
    xp_auth_frame res;
    if ((rc = recv_frame(io, &res)) != 0) {
        if (rc == ECT_ECLOSED)
            return ect_set_error(ECT_ECLOSED,
                                 "the target %s closed the connection during the "
                                 "handshake",
                                 peer);
        return rc;
    }
    if (res.type != XP_AUTH_RESULT)
        return ect_set_error(ECT_EPROTO, "auth: expected a RESULT from %s, got type %u", peer,
                             res.type);
    if (res.verdict == XP_AUTH_UNKNOWN_KEY)
        return ect_set_error(ECT_EACCES, "the target %s does not accept our key %s", peer,
                             ks->pub_z85);
    if (res.verdict != XP_AUTH_OK)
        return ect_set_error(ECT_EACCES, "the target %s refused us: %s", peer,
                             xp_auth_verdict_str(res.verdict));
    uint8_t want[ECT_KEY_BYTES];
    if (sodium_memcmp(res.key, ch.key, ECT_KEY_BYTES) != 0 ||
        make_proof(ks, ch.key, ks->pub, ch.key, ch.nonce, r.nonce, label_t, want) != 0 ||
        sodium_memcmp(want, res.proof, sizeof want) != 0)
        return ect_set_error(ECT_EACCES,
                             "the target %s's proof is wrong (it does not hold the secret of "
                             "the key it presented)",
                             peer);
    return 0;
}
