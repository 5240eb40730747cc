/*
 * fuzz_zmtp — the ZMTP codec (src/wire/zmtp.c) in its four roles, fed
 * arbitrary bytes split at points the input chooses, every message it hands
 * out sent back (a REP or ROUTER echoes with the envelope it got, a REQ
 * sends the body as its next request, a DEALER as its next message, with a
 * heartbeat PING) so the send paths and the held-back queue run too, and
 * the output drained in pieces.
 *
 * Input: byte 0 picks the role (bit 0, and bit 7 for DEALER / ROUTER),
 * whether a valid handshake of the role's peer comes first (bit 1, so most
 * inputs get past the greeting), and whether a message is queued before the
 * handshake (bit 2); bits 3-6 the output piece. Then chunks: a length byte
 * (0: the rest) and that many bytes.
 */
#include <stdint.h>
#include <string.h>

#include "util/util.h"
#include "wire/zmtp.h"

#define FZ_MAXMSG 4096

static void drain(zmtp_conn *c, size_t piece) {
    size_t n;
    while (zmtp_conn_out(c, &n) != NULL) {
        if (n == 0) __builtin_trap();
        zmtp_conn_sent(c, n < piece ? n : piece);
    }
}

static void answer(zmtp_conn *c, zmtp_role role) {
    zmtp_msg m;
    int rc;
    while ((rc = zmtp_conn_next(c, &m)) == 1) {
        if (m.body_len > FZ_MAXMSG || m.envelope_len > FZ_MAXMSG + 9 * (ZMTP_MAX_ENVELOPE + 1))
            __builtin_trap();
        if ((role == ZMTP_REQ || role == ZMTP_DEALER) && m.envelope_len) __builtin_trap();
        if (role == ZMTP_REP && m.envelope_len < 2) __builtin_trap(); /* at least the delimiter */
        if (role == ZMTP_ROUTER && m.envelope_len != 0 && m.envelope_len != 2) __builtin_trap();
        if (role == ZMTP_REP || role == ZMTP_ROUTER)
            rc = zmtp_conn_send_rep(c, m.envelope, m.envelope_len, m.body, m.body_len);
        else if (role == ZMTP_DEALER)
            rc = zmtp_conn_send(c, m.body, m.body_len) || zmtp_conn_ping(c);
        else
            rc = zmtp_conn_send_req(c, m.body, m.body_len);
        if (rc) return;
    }
    if (rc < 0 && zmtp_conn_ready(c)) __builtin_trap(); /* an error is final */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ect_log_set_level(ECT_LOG_ERROR);
    if (size < 1) return 0;
    static const zmtp_role roles[4] = {ZMTP_REQ, ZMTP_REP, ZMTP_DEALER, ZMTP_ROUTER};
    static const zmtp_role peers[4] = {ZMTP_REP, ZMTP_REQ, ZMTP_ROUTER, ZMTP_DEALER};
    unsigned ri = (data[0] & 1) | (data[0] >> 6 & 2);
    zmtp_role role = roles[ri];
    bool handshake = data[0] & 2, early = data[0] & 4;
    size_t piece = (size_t)(data[0] >> 3 & 15) + 1;
    data++;
    size--;
    zmtp_conn *c = NULL;
    if (zmtp_conn_new(role, FZ_MAXMSG, &c) != 0) return 0;
    if (early && role == ZMTP_REQ) zmtp_conn_send_req(c, "early", 5);
    if (early && (role == ZMTP_DEALER || role == ZMTP_ROUTER)) zmtp_conn_send(c, "early", 5);
    if (handshake) {
        zmtp_conn *peer = NULL;
        if (zmtp_conn_new(peers[ri], FZ_MAXMSG, &peer) == 0) {
            size_t n;
            const uint8_t *p = zmtp_conn_out(peer, &n);
            if (zmtp_conn_feed(c, p, n) != 0 || !zmtp_conn_ready(c)) __builtin_trap();
            zmtp_conn_free(peer);
        }
    }
    while (size > 0) {
        size_t k = data[0] ? data[0] : size - 1;
        data++;
        size--;
        if (k > size) k = size;
        int rc = zmtp_conn_feed(c, data, k);
        data += k;
        size -= k;
        if (rc) {
            if (zmtp_conn_feed(c, data, size) != rc) __builtin_trap(); /* final */
            break;
        }
        answer(c, role);
        drain(c, piece);
    }
    zmtp_conn_free(c);
    return 0;
}
