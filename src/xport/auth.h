/*
 * auth — the data plane's peer authentication (docs/PROTOCOL.md "Data-plane
 * handshake"). With a key directory configured (ect_xport_opts.curve_keys),
 * every tcp and shm connection runs this handshake right after its hello and
 * before any write or mapping: the target sends a challenge (its public key
 * and a fresh nonce), the initiator answers with its public key, its own
 * nonce and a proof, the target answers with a verdict and its own proof.
 * Each proof is a keyed BLAKE2b (crypto_generichash) over both nonces, keyed
 * by a hash of the X25519 shared secret (crypto_scalarmult) and both public
 * keys: only a holder of the secret key behind a public key can compute it,
 * and the fresh nonces keep it from being replayed. The handshake
 * authenticates the peer at connection start; it does not encrypt or
 * integrity-protect the bytes that follow.
 *
 * The frame codec is pure (the fuzz target drives it and both handshake
 * sides with arbitrary bytes); the two sides do their I/O through an
 * xp_auth_io, which bounds every receive by the io timeout.
 *
 * Threading: every function may be called from any thread at once; a
 * keyset is read only.
 */
#ifndef ECT_XPORT_AUTH_H
#define ECT_XPORT_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "util/keys.h"

#define XP_AUTH_MAGIC 0x4B544345u /* "ECTK" */
#define XP_AUTH_VERSION 1
#define XP_AUTH_LEN 112

enum { XP_AUTH_CHALLENGE = 1, XP_AUTH_RESPONSE = 2, XP_AUTH_RESULT = 3 };

/* Verdicts: what the sender of a RESPONSE or RESULT concluded. */
enum {
    XP_AUTH_OK = 0,
    XP_AUTH_UNKNOWN_KEY = 1,   /* the receiver's public key is not among the sender's accepted */
    XP_AUTH_BAD_PROOF = 2,     /* the receiver's proof is wrong */
    XP_AUTH_NO_KEYS = 3,       /* the sender has no keys: it refuses an authenticated session */
    XP_AUTH_KEYS_REQUIRED = 4, /* the sender has keys: it refuses a plain session */
    XP_AUTH_VERDICT_MAX = 4
};

typedef struct xp_auth_frame {
    uint16_t type;                /* XP_AUTH_CHALLENGE, _RESPONSE or _RESULT */
    uint32_t verdict;             /* XP_AUTH_OK.. (0 in a CHALLENGE) */
    uint8_t key[ECT_KEY_BYTES];   /* the sender's public key (zero when refusing) */
    uint8_t nonce[ECT_KEY_BYTES]; /* the sender's fresh nonce (zero in a RESULT) */
    uint8_t proof[ECT_KEY_BYTES]; /* the sender's proof (zero in a CHALLENGE) */
} xp_auth_frame;

void xp_auth_encode(uint8_t out[XP_AUTH_LEN], const xp_auth_frame *f);
/* Decodes one frame of exactly XP_AUTH_LEN bytes; ECT_EPROTO with detail for
 * a wrong size, magic, version, type or verdict. */
int xp_auth_decode(const uint8_t *b, size_t len, xp_auth_frame *f);
/* The refusal a side sends instead of a handshake (verdict _NO_KEYS or
 * _KEYS_REQUIRED), as a RESULT frame. */
void xp_auth_encode_refusal(uint8_t out[XP_AUTH_LEN], uint32_t verdict);
/* What a verdict tells its receiver, for error messages. */
const char *xp_auth_verdict_str(uint32_t verdict);

/* The transport's I/O: send and receive exactly n bytes (tcp) or one message
 * of n bytes (shm), each bounded by the io timeout. 0 or ECT_E*. */
typedef struct xp_auth_io {
    int (*send)(void *ctx, const uint8_t *b, size_t n);
    int (*recv)(void *ctx, uint8_t *b, size_t n);
    void *ctx;
} xp_auth_io;

/* Target side, after the hello: challenge, check, verdict. Returns 0 with
 * *peer = the index of the initiator's key in ks (its name:
 * ks->accept_names[*peer]), or ECT_EACCES (the initiator's key is not
 * accepted, its proof is wrong, or it refused ours), ECT_EPROTO (a bad
 * frame) or the I/O's error; the detail says which. The caller closes the
 * connection on failure. */
int xp_auth_target(const ect_keyset *ks, const xp_auth_io *io, int *peer);
/* Initiator side, after the hello. 0, or ECT_EACCES ("the target does not
 * accept our key", "the target's key is not accepted", a wrong proof, a
 * target without keys), ECT_EPROTO or the I/O's error. `peer` names the
 * target in messages. */
int xp_auth_initiator(const ect_keyset *ks, const xp_auth_io *io, const char *peer);

/* Initialises libsodium once per process; ECT_EIO if it cannot. */
int xp_auth_init(void);

#endif
