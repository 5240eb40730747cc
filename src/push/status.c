/*
 * status — ect_push_status: asks one consumer shard for its status with the
 * ect_status control op (an extension, docs/PROTOCOL.md), for `ect status`
 * and for operators' tools. One REQ exchange in fail-fast mode on a context
 * of its own, so a stopped consumer is reported at once (connection
 * refused) and a silent one after the timeout.
 */
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "push/control_client.h"
#include "util/keys.h"
#include "util/util.h"

int ect_push_status(const char *host, int port, int timeout_ms, char **json) {
    return ect_push_status_keyed(host, port, timeout_ms, NULL, json);
}

int ect_push_status_keyed(const char *host, int port, int timeout_ms, const char *curve_keys,
                          char **json) {
    if (json) *json = NULL;
    if (!host || !*host || !json)
        return ect_set_error(ECT_EINVAL, "push status: host and json required");
    if (port < 1 || port > 65535)
        return ect_set_error(ECT_EINVAL, "push status: port %d: must be 1..65535", port);
    if (timeout_ms < 1)
        return ect_set_error(ECT_EINVAL, "push status: timeout_ms %d: must be >= 1", timeout_ms);
    ect_keyset *ks = NULL;
    int rc = curve_keys ? ect_keys_load(curve_keys, &ks) : 0;
    if (rc) return rc;
    void *z = zmq_ctx_new();
    if (!z) {
        ect_keys_free(ks);
        return ect_set_error(ECT_EIO, "push status: zmq_ctx_new failed");
    }
    ctl_client *c = NULL;
    rc = ctl_client_open(z, timeout_ms, &c);
    if (rc) {
        zmq_ctx_term(z);
        ect_keys_free(ks);
        return rc;
    }
    ctl_client_fail_fast(c, true);
    ctl_client_set_keys(c, ks);
    wire_ctl_request q = {.op = WIRE_OP_ECT_STATUS};
    wire_ctl_reply rep;
    rc = ctl_call(c, host, port, &q, &rep);
    if ((rc == ECT_ECONNREFUSED || rc == ECT_ETIMEDOUT) && ks) {
        rc = ect_set_error(rc,
                           "no consumer answers at %s:%d (%s): is it running, with keys "
                           "that accept ours (%s/self.public)?",
                           host, port,
                           rc == ECT_ECONNREFUSED ? "connection closed or refused"
                                                  : "no reply within the timeout",
                           curve_keys);
    } else if (rc == ECT_ECONNREFUSED || rc == ECT_ETIMEDOUT) {
        rc = ect_set_error(rc,
                           "no consumer answers at %s:%d (%s): is it running? (one that runs "
                           "with --curve-keys answers only clients with an accepted key)",
                           host, port,
                           rc == ECT_ECONNREFUSED ? "connection refused"
                                                  : "no reply within the timeout");
    } else if (rc) {
        char why[ECT_ERROR_LEN];
        snprintf(why, sizeof why, "%s", ect_last_error());
        rc = ect_set_error(rc, "%s:%d: %s", host, port, why);
    } else if (!rep.ok) {
        if (rep.error && strstr(rep.error, "unknown control op"))
            rc = ect_set_error(ECT_ENOTSUP,
                               "%s:%d does not know the ect_status op (an upstream consumer?): "
                               "it answered \"%.200s\"",
                               host, port, rep.error);
        else
            rc = ect_set_error(ECT_EPROTO, "%s:%d refused ect_status: %.200s", host, port,
                               rep.error ? rep.error : "");
    } else {
        *json = rep.u.ect_status;
        rep.u.ect_status = NULL;
    }
    wire_ctl_reply_clear(&rep);
    ctl_client_close(c);
    zmq_ctx_term(z);
    ect_keys_free(ks);
    return rc;
}

int ect_push_ping(const char *host, int port, int timeout_ms, uint64_t *rtt_ns, size_t n) {
    if (!host || !*host || (n && !rtt_ns))
        return ect_set_error(ECT_EINVAL, "push ping: host and rtt_ns required");
    if (port < 1 || port > 65535)
        return ect_set_error(ECT_EINVAL, "push ping: port %d: must be 1..65535", port);
    if (timeout_ms < 1)
        return ect_set_error(ECT_EINVAL, "push ping: timeout_ms %d: must be >= 1", timeout_ms);
    void *z = zmq_ctx_new();
    if (!z) return ect_set_error(ECT_EIO, "push ping: zmq_ctx_new failed");
    ctl_client *c = NULL;
    int rc = ctl_client_open(z, timeout_ms, &c);
    if (rc) {
        zmq_ctx_term(z);
        return rc;
    }
    ctl_client_fail_fast(c, true);
    /* event_port: the cheapest op every consumer (ours and upstream) answers */
    wire_ctl_request q = {.op = WIRE_OP_EVENT_PORT};
    for (size_t i = 0; !rc && i <= n; i++) { /* exchange 0 connects: not timed */
        wire_ctl_reply rep;
        uint64_t t0 = ect_now_ns();
        rc = ctl_call_ok(c, host, port, &q, &rep);
        if (!rc && i) rtt_ns[i - 1] = ect_now_ns() - t0;
        wire_ctl_reply_clear(&rep);
    }
    if (rc == ECT_ECONNREFUSED || rc == ECT_ETIMEDOUT)
        rc = ect_set_error(rc, "no consumer answers at %s:%d (%s): is it running?", host, port,
                           rc == ECT_ECONNREFUSED ? "connection refused"
                                                  : "no reply within the timeout");
    ctl_client_close(c);
    zmq_ctx_term(z);
    return rc;
}
