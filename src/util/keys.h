/*
 * keys — a key directory: this side's CURVE key pair and the public keys it
 * accepts. One format for every user: the ZMQ sockets' CurveZMQ and the data
 * plane's handshake read the same directory.
 *
 * Layout (docs/SECURITY.md; `ect keygen DIR` writes the first two):
 *   DIR/self.public    this side's public key, 40 characters of Z85 (as
 *                      zmq_curve_keypair gives it) and an optional newline
 *   DIR/self.secret    its secret key, same format; refused when the group
 *                      or others may read it (mode 0600 expected)
 *   DIR/accept/NAME.public
 *                      one file per accepted peer: a copy of that peer's
 *                      self.public; NAME is free text used in log lines.
 *                      Files not ending in ".public" are ignored.
 * The keys are Curve25519 (crypto_box) keys: libsodium and CurveZMQ use the
 * same 32 bytes.
 *
 * Threading: a loaded ect_keyset is immutable; any thread may read it.
 * Each owner (a role, its transport) holds a reference: ect_keys_ref takes
 * one, ect_keys_free drops one, the last frees the set. A role reads its
 * directory once and hands that set to its transport, so a rotation of the
 * files while it starts cannot give its two sides different keys.
 */
#ifndef ECT_UTIL_KEYS_H
#define ECT_UTIL_KEYS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ECT_KEY_BYTES 32
#define ECT_KEY_Z85_LEN 40

typedef struct ect_keyset {
    uint8_t pub[ECT_KEY_BYTES];
    uint8_t sec[ECT_KEY_BYTES];
    char pub_z85[ECT_KEY_Z85_LEN + 1];
    char sec_z85[ECT_KEY_Z85_LEN + 1];
    size_t n_accept;
    uint8_t (*accept)[ECT_KEY_BYTES];        /* n_accept keys, sorted by name */
    char (*accept_z85)[ECT_KEY_Z85_LEN + 1]; /* the same as Z85 text */
    char **accept_names;                     /* NAME of accept/NAME.public */
    char *dir;
    /* references beyond the first (0: one owner; a zeroed set, as the
     * fuzzers build, is one owner too) */
    _Atomic unsigned extra_refs;
} ect_keyset;

/* Loads DIR. Returns 0 and *out (free with ect_keys_free), or ECT_EINVAL
 * (missing file, bad Z85, a public key that does not match the secret, a
 * secret readable by group/others, no accepted key) / ECT_ENOMEM / ECT_EIO,
 * with ect_last_error() naming the file and what is wrong. */
int ect_keys_load(const char *dir, ect_keyset **out);
/* Takes a reference on ks (NULL: none); returns ks. Thread-safe. */
ect_keyset *ect_keys_ref(ect_keyset *ks);
/* Drops a reference; the last one frees the set (NULL: nothing). */
void ect_keys_free(ect_keyset *ks);
/* How many times ect_keys_load has read a directory in this process (tests:
 * a role reads its directory once). */
uint64_t ect_keys_load_count(void);

/* Index of pub among the accepted keys, or -1. */
int ect_keys_find(const ect_keyset *ks, const uint8_t pub[ECT_KEY_BYTES]);
static inline bool ect_keys_accepts(const ect_keyset *ks, const uint8_t pub[ECT_KEY_BYTES]) {
    return ect_keys_find(ks, pub) >= 0;
}

/* Z85 text (40 characters + NUL) of a 32-byte key. */
void ect_key_z85(const uint8_t key[ECT_KEY_BYTES], char out[ECT_KEY_Z85_LEN + 1]);

#endif
