/*
 * jconf — the configuration vocabulary shared by every role's
 * ect_X_open_config, and its strict decoder. Pure: parses JSON text into
 * typed values, touches no socket or file.
 *
 * One vocabulary (JC_* below) serves a whole instance; each role names the
 * keys it reads, and the shared keys (jc_shared) are accepted by every role
 * even where unused, so one file can configure all the roles of an
 * instance. Everything else is refused with ECT_EINVAL and a sentence naming
 * the key.
 */
#ifndef ECT_JCONF_H
#define ECT_JCONF_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

typedef enum jc_key {
    /* shared by every role (upstream's ec_transfer_config names) */
    JC_EC_IP,
    JC_EC_PORT,
    JC_EC_BUFFER_SIZE,
    JC_TP_SIZE,
    JC_TP_RANK,
    JC_DP_INDEX,
    JC_CONTROL_TIMEOUT_S,
    JC_PUSH_WAIT_TIMEOUT_S,
    JC_EC_BUFFER_DEVICE,
    JC_TRANSPORT,
    /* a role's own */
    JC_XPORT_LISTEN,
    JC_TTL_MS,
    JC_PENDING_GRACE_MS,
    JC_REAP_INTERVAL_MS,
    JC_MAX_EVENTS,
    JC_MAX_TOMBSTONES,
    JC_CANCEL_ATTEMPTS,
    JC_MIN_DRAIN_INTERVAL_MS,
    JC_ACCEPT_ANY,
    JC_REFRESH_AFTER_MS,
    JC_INPUT_WAIT_MS,
    JC_CONNECT_TIMEOUT_MS,
    JC_IO_TIMEOUT_MS,
    JC_LISTEN_HOST,
    JC_DOWN_BACKOFF_MS,
    JC_DOWN_BACKOFF_MAX_MS,
    JC_ALIGNMENT,
    JC_MAX_LANES,
    JC_PAGE_ITEMS,
    JC_MAX_QUEUED_BYTES,
    JC_REQUEST_RETRY_MS,
    JC_TIMEOUT_MS,
    JC_QUARANTINE_MS,
    JC_STAGING_WAIT_MS,
    JC_EXPECT_SHARDS,
    JC_POOL_MEMORY,
    JC_ADVERTISE,
    JC_DATA_PORT,
    JC_CURVE_KEYS,
    JC_EVENT_AUTH,
    JC_TRUSTED_PEERS,
    JC_RECHECK_MS,
    JC_CONNECT_ALLOW,
    JC_MAX_CONNS,
    JC_MAX_CONNS_PER_PEER,
    JC_MAX_LANES_PER_PEER,
    JC_NKEYS
} jc_key;

/* The first JC_NSHARED keys are the shared ones. */
#define JC_NSHARED (JC_TRANSPORT + 1)

/* One decoded value; `set` tells whether the text gave it. Integers land in
 * u (and i, the same value when it fits int), numbers of seconds in d,
 * booleans in b, strings in s (pointing into the parsed tree). */
typedef struct jc_val {
    bool set;
    uint64_t u;
    int i;
    double d;
    bool b;
    const char *s;
} jc_val;

/* What one role reads: its name for messages and the keys it uses. */
typedef struct jc_role {
    const char *name; /* "push consumer" */
    const jc_key *keys;
    size_t n;
} jc_role;

/* Parses `json` (one JSON object, NUL-terminated) against the vocabulary for
 * `role`: fills vals[JC_NKEYS] and keeps the tree in *root (the strings
 * point into it; json_decref it when done, also on failure). Returns 0 or
 * ECT_EINVAL with a sentence naming the key, or ECT_ENOMEM. */
int jc_parse(const char *json, const jc_role *role, jc_val vals[JC_NKEYS], json_t **root);

/* The key's name in the text ("ec_port"). */
const char *jc_key_name(jc_key k);

/* Milliseconds for a number of seconds, as upstream converts it:
 * max(1, ceil(s x 1000)), saturated at INT32_MAX. */
int jc_seconds_to_ms(double s);

#endif
