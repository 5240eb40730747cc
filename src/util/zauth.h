/*
 * zauth — who may talk to our ZMQ sockets (docs/SECURITY.md).
 *
 * A server socket is made a CurveZMQ server (zauth_curve_server) or, for the
 * push consumer's event port without keys, a ZMQ PLAIN server whose password
 * is a random per-shard secret (zauth_plain_server). Either way libzmq asks
 * the context's ZAP handler (RFC 27, inproc://zeromq.zap.01) about every
 * new connection; zauth_open starts that handler on one context. It accepts
 *   CURVE  a client whose public key is one of the key set's accepted keys,
 *          or the set's own public key (a peer holding our own pair is us),
 *   PLAIN  a client that gives the registered secret for the socket's domain,
 * and refuses everything else, counting each refusal and logging the first
 * one and then at most one summary line per ZAUTH_LOG_EVERY_MS.
 *
 * A client socket is made a CurveZMQ client with zauth_curve_client. It must
 * name the server's public key; zauth_server_key picks it: with one accepted
 * key, that key; with several, the one the server at that endpoint holds,
 * found by a probe handshake per candidate (cached per endpoint).
 *
 * Every setup call must come before the socket's bind/connect (ZMQ applies
 * security options to later connections only).
 *
 * Threading: zauth_open/close from the context owner's thread; the handler
 * runs on a thread of its own; zauth_refusals from any thread. The other
 * functions touch only the socket passed in (the probe cache has its own
 * lock) and follow that socket's thread rule.
 */
#ifndef ECT_UTIL_ZAUTH_H
#define ECT_UTIL_ZAUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/keys.h"

#define ZAUTH_LOG_EVERY_MS 10000
#define ZAUTH_SECRET_LEN 32 /* hex characters of a PLAIN secret */
#define ZAUTH_PLAIN_USER "ect"

typedef struct zauth zauth;

/* Starts the ZAP handler on zctx (not owned; must outlive the handler);
 * zctx NULL: a detached handler with no socket and no thread, for
 * zauth_decide alone (tests, the fuzzer).
 * ks (may be NULL: no CURVE client is accepted) is borrowed and must outlive
 * the handler. `who` names the role in log lines. At most one per context:
 * a second bind of the ZAP endpoint fails with ECT_EEXIST. Caller owns *out
 * (zauth_close); *out is NULL on failure. ECT_EIO / ECT_ENOMEM. */
int zauth_open(void *zctx, const ect_keyset *ks, const char *who, zauth **out);

/* Stops the handler and closes its socket; call it after the context's
 * server sockets are closed and before zmq_ctx_term. NULL is fine. */
void zauth_close(zauth *a);

/* One ZAP request's frames (RFC 27: version, request id, domain, address,
 * identity, mechanism, credentials...). */
typedef struct zauth_frame {
    const void *p;
    size_t n;
} zauth_frame;

/* The handler's decision on one request: true (status 200) with the user id
 * in user, or false (400), counted and logged as a refusal. Any bytes are
 * fine. Handler thread (or a detached handler's caller) only. */
bool zauth_decide(zauth *a, const zauth_frame *f, int n, char *user, size_t cap);

/* The PLAIN secret the handler checks (zauth_plain_server sets it). */
void zauth_set_secret(zauth *a, const char *secret);

/* Connections refused since open (CURVE and PLAIN). Any thread. */
uint64_t zauth_refusals(zauth *a);

/* Makes sock a CURVE server with ks's key pair, checked by the context's
 * handler. ECT_ENOTSUP when libzmq lacks CURVE; ECT_EIO. */
int zauth_curve_server(void *sock, const ect_keyset *ks);

/* Makes sock a PLAIN server that accepts only user ZAUTH_PLAIN_USER with
 * password `secret` (registered in a; one secret per handler). */
int zauth_plain_server(zauth *a, void *sock, const char *secret);

/* Fills secret with ZAUTH_SECRET_LEN random hex characters and a NUL. */
void zauth_new_secret(char secret[ZAUTH_SECRET_LEN + 1]);

/* Makes sock a PLAIN client giving `secret`. */
int zauth_plain_client(void *sock, const char *secret);

/* Makes sock a CURVE client with ks's key pair that expects the server key
 * server_z85 (40 Z85 characters). */
int zauth_curve_client(void *sock, const ect_keyset *ks, const char *server_z85);

/* The public key (Z85) of the server at endpoint "tcp://host:port" (docs/
 * SECURITY.md "Which server key"): ks's only accepted key; with several, a
 * probe per candidate on a fresh socket of probe_type (one that sends
 * nothing unasked: ZMQ_REQ for a REP, ZMQ_DEALER for a ROUTER), up to
 * timeout_ms each, on zctx; the key whose handshake the server completes (or
 * refuses as unknown client, which proves it holds it) is cached per endpoint.
 * When no candidate can be proven (the server is not up yet, none matches)
 * the first accepted key is returned, uncached, and a warning logged.
 * Returns 0 (never fails without keys to choose from). */
int zauth_server_key(void *zctx, const ect_keyset *ks, int probe_type, const char *endpoint,
                     int timeout_ms, char out[ECT_KEY_Z85_LEN + 1]);

/* This process serves CURVE on port with ks's key pair (register after
 * bind, withdraw before close). zauth_server_key answers ks's own public key
 * for an endpoint on such a port, so a client in the same process (the push
 * consumer command's scheduler) needs no accept/ entry for its own server. */
void zauth_local_server(int port, const ect_keyset *ks);
void zauth_local_server_gone(int port);

/* Forgets a cached server key (the server may have new keys). */
void zauth_forget(const char *endpoint);

/* zauth_server_key + zauth_curve_client: sets up sock to connect to
 * endpoint. ks NULL: does nothing and returns 0. */
int zauth_client(void *zctx, void *sock, const ect_keyset *ks, int probe_type, const char *endpoint,
                 int timeout_ms);

#endif
