/*
 * zmtp — ZMTP 3.x with the NULL mechanism for one REQ, REP, DEALER or ROUTER
 * connection,
 * sans I/O (zmtp.h has the contract, docs/PROTOCOL.md the bytes).
 *
 * Receiving is one state machine over the bytes as they come (greeting, then
 * per frame: flags, size, body), so any split of the input gives the same
 * result and nothing is decided later than the byte that decides it: a
 * ZMTP 1.0/2.0 peer or a security mechanism other than NULL is refused at the
 * first byte that shows it, a frame over the message bound at its size field.
 *
 * Complete messages wait in one buffer `q` as records [rec_hdr][envelope
 * bytes][body bytes]; the message being assembled is the record after them.
 * zmtp_conn_next hands out the record at q_head and moves past it; the bytes
 * stay until the next feed compacts the buffer, which is what keeps the
 * pointers of a zmtp_msg valid "until the next call". Only what a message
 * needs is stored: a REQ's delimiter and every body frame after the first
 * are counted against max_msg and dropped.
 *
 * Byte-identical to libzmq 4.3 (captured from a real exchange): the greeting
 * says version 3.1 (the minor version libzmq sends; 3.1 only adds PING/PONG,
 * which we answer), the 8 padding bytes are 00..00 01 as libzmq writes them,
 * and READY carries Socket-Type, plus an empty Identity for REQ.
 */
#include "wire/zmtp.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util/util.h"

#define F_MORE 0x01
#define F_LONG 0x02
#define F_COMMAND 0x04
#define F_RESERVED 0xF8

#define ZMTP_CMD_MAX 8192 /* largest command body: READY's properties, PING's context */
#define PING_CTX_MAX 16   /* RFC 37: a PING's context is at most 16 bytes */
#define TYPE_MAX 16       /* longest Socket-Type value kept ("DEALER", "ROUTER": 6) */

enum rx_state { RX_GREETING, RX_FLAGS, RX_SIZE, RX_BODY, RX_DEAD };
/* Where the frame being received goes. */
enum frame_dest { TO_COMMAND, TO_QUEUE, TO_NOWHERE };
/* Which frame of a message comes next. */
enum msg_phase { PH_DELIM, PH_ENVELOPE, PH_OPT_DELIM, PH_BODY, PH_EXTRA };

typedef struct zbuf {
    uint8_t *p;
    size_t len, cap;
} zbuf;

/* The head of a queued message record; memcpy'd (q is not aligned). */
typedef struct rec_hdr {
    uint64_t env_len, body_len, multi;
} rec_hdr;

struct zmtp_conn {
    zmtp_role role;
    uint64_t max_msg;
    int err; /* the final error, 0 while healthy */
    char errmsg[200];

    /* receiving */
    enum rx_state state;
    uint8_t greet[ZMTP_GREETING_LEN];
    size_t greet_n;
    bool peer_ready;
    char peer_type[TYPE_MAX];
    uint8_t flags;
    uint8_t size_bytes[8];
    size_t size_n, size_len;
    uint64_t frame_size, frame_got;
    enum frame_dest dest;

    /* the message being assembled */
    bool in_msg, discard, multi;
    enum msg_phase phase;
    size_t msg_start; /* offset of its record in q */
    uint64_t msg_total, env_len, body_len;
    unsigned env_frames;

    uint8_t cmd[ZMTP_CMD_MAX];
    size_t cmd_n;

    zbuf q; /* records [q_head, q_done) complete, then the one assembled */
    size_t q_head, q_done;

    /* sending: out.p[out_head, out.len); held: messages queued before the
     * peer's READY, moved to out when it comes */
    zbuf out;
    size_t out_head;
    zbuf held;
};

static const uint8_t mech_null[20] = {'N', 'U', 'L', 'L'};

static const char *const role_names[] = {"REQ", "REP", "DEALER", "ROUTER"};

/* The phase a message of `role` starts in: a REQ's reply starts with the
 * delimiter, a REP's request with its envelope, a ROUTER's may start with a
 * delimiter (a REQ peer), a DEALER's is the body. */
static enum msg_phase first_phase(zmtp_role role) {
    switch (role) {
    case ZMTP_REQ: return PH_DELIM;
    case ZMTP_REP: return PH_ENVELOPE;
    case ZMTP_ROUTER: return PH_OPT_DELIM;
    case ZMTP_DEALER: break;
    }
    return PH_BODY;
}

/* ---- buffers */

static int zbuf_reserve(zbuf *b, size_t extra) {
    if (extra <= b->cap - b->len) return 0;
    if (extra > SIZE_MAX / 2 - b->len) return ect_set_error(ECT_ENOMEM, "zmtp: buffer too large");
    size_t need = b->len + extra, cap = b->cap ? b->cap * 2 : 256;
    if (cap < need) cap = need;
    uint8_t *p = realloc(b->p, cap);
    if (!p) return ect_set_error(ECT_ENOMEM, "zmtp: out of memory (%zu bytes)", cap);
    b->p = p;
    b->cap = cap;
    return 0;
}

static int zbuf_append(zbuf *b, const void *data, size_t n) {
    int rc = zbuf_reserve(b, n);
    if (rc) return rc;
    if (n) memcpy(b->p + b->len, data, n);
    b->len += n;
    return 0;
}

/* A frame's flags and size as ZMTP writes them (libzmq's encoder: the long
 * form exactly when the size does not fit one byte). */
static size_t frame_header(uint8_t *h, uint8_t flags, uint64_t size) {
    if (size <= 255) {
        h[0] = flags;
        h[1] = (uint8_t)size;
        return 2;
    }
    h[0] = flags | F_LONG;
    for (int i = 0; i < 8; i++) h[1 + i] = (uint8_t)(size >> (56 - 8 * i));
    return 9;
}

/* ---- errors: every one is final */

__attribute__((format(printf, 3, 4))) static int fail(zmtp_conn *c, int code, const char *fmt,
                                                      ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->errmsg, sizeof c->errmsg, fmt, ap);
    va_end(ap);
    c->err = code;
    c->state = RX_DEAD;
    return ect_set_error(code, "zmtp: %s", c->errmsg);
}

static int failed_before(const zmtp_conn *c) {
    return ect_set_error(c->err, "zmtp: %s", c->errmsg);
}

/* ---- sending */

/* Room for n more bytes to send (reclaiming what was sent), so that the
 * appends of one message that follow cannot fail half way. */
static int out_prepare(zmtp_conn *c, size_t n) {
    if (c->out_head == c->out.len) {
        c->out.len = c->out_head = 0;
    } else if (c->out_head > 0 && c->out_head >= c->out.len / 2) {
        memmove(c->out.p, c->out.p + c->out_head, c->out.len - c->out_head);
        c->out.len -= c->out_head;
        c->out_head = 0;
    }
    return zbuf_reserve(&c->out, n);
}

static int out_append(zmtp_conn *c, const void *data, size_t n) {
    int rc = out_prepare(c, n);
    return rc ? rc : zbuf_append(&c->out, data, n);
}

static int out_frame(zmtp_conn *c, uint8_t flags, const void *data, size_t n) {
    uint8_t h[9];
    int rc = out_append(c, h, frame_header(h, flags, n));
    return rc ? rc : out_append(c, data, n);
}

/* Queues a message: `head` (delimiter or envelope, framed), then the body
 * as one frame. Before the peer's READY it is held back: libzmq (4.3.4,
 * checked) drops a connection whose first message arrives in the same read
 * as our READY while it has not sent its own READY yet (monitor:
 * HANDSHAKE_FAILED_PROTOCOL, ZMTP_UNEXPECTED_COMMAND), and a libzmq socket
 * itself never sends a message before the handshake is through. */
static int queue_message(zmtp_conn *c, const void *head, size_t head_len, const void *body,
                         size_t len) {
    if (len > SIZE_MAX / 2 || head_len > SIZE_MAX / 2)
        return ect_set_error(ECT_EINVAL, "zmtp: message too large");
    uint8_t h[9];
    size_t hl = frame_header(h, 0, len);
    size_t total = head_len + hl + len;
    zbuf *b = c->peer_ready ? &c->out : &c->held;
    int rc = c->peer_ready ? out_prepare(c, total) : zbuf_reserve(b, total);
    if (rc) return rc;
    zbuf_append(b, head, head_len);
    zbuf_append(b, h, hl);
    return zbuf_append(b, body, len);
}

/* A property of a READY command: name-size, name, value-size (4, BE), value. */
static size_t put_property(uint8_t *p, const char *name, const char *value) {
    size_t nl = strlen(name), vl = strlen(value);
    p[0] = (uint8_t)nl;
    memcpy(p + 1, name, nl);
    p[1 + nl] = p[2 + nl] = p[3 + nl] = 0;
    p[4 + nl] = (uint8_t)vl;
    memcpy(p + 5 + nl, value, vl);
    return 5 + nl + vl;
}

static int queue_handshake(zmtp_conn *c) {
    uint8_t g[ZMTP_GREETING_LEN] = {0xFF, 0, 0, 0, 0, 0, 0, 0, 1, 0x7F, 3, 1};
    memcpy(g + 12, mech_null, sizeof mech_null);
    int rc = out_append(c, g, sizeof g);
    if (rc) return rc;
    uint8_t r[64];
    size_t n = 0;
    r[n++] = 5;
    memcpy(r + n, "READY", 5);
    n += 5;
    n += put_property(r + n, "Socket-Type", role_names[c->role]);
    /* libzmq 4.3 (mechanism.cpp) sends an (empty) Identity from REQ, DEALER
     * and ROUTER sockets, none from REP */
    if (c->role != ZMTP_REP) n += put_property(r + n, "Identity", "");
    return out_frame(c, F_COMMAND, r, n);
}

/* ---- receiving: the greeting, one byte at a time */

static int greeting_byte(zmtp_conn *c, uint8_t b) {
    size_t i = c->greet_n;
    c->greet[c->greet_n++] = b;
    if (i == 0 && b != 0xFF)
        return fail(c, ECT_EPROTO,
                    "the peer does not speak ZMTP 3 (first byte 0x%02x, not 0xff: a ZMTP 1.0 "
                    "peer?)",
                    b);
    if (i == 9 && !(b & 1))
        return fail(c, ECT_EPROTO, "the peer's greeting is ZMTP 1.0 (signature byte 0x%02x)", b);
    if (i == 10 && b < 3)
        return fail(c, ECT_EPROTO,
                    "the peer speaks ZMTP major version %u (libzmq before 4.0?); we need 3", b);
    if (i >= 12 && i < 32 && b != mech_null[i - 12]) {
        char name[21];
        size_t k = 0;
        for (size_t j = 12; j <= i && c->greet[j]; j++)
            name[k++] = (c->greet[j] >= 0x20 && c->greet[j] < 0x7F) ? (char)c->greet[j] : '?';
        name[k] = '\0';
        return fail(c, ECT_EPROTO,
                    "the peer's security mechanism \"%s...\" is not NULL (CurveZMQ and PLAIN "
                    "peers need the libzmq path)",
                    name);
    }
    if (c->greet_n == ZMTP_GREETING_LEN) c->state = RX_FLAGS;
    return 0;
}

/* ---- receiving: commands */

/* The peers libzmq 4.3 accepts for each type (mechanism.cpp,
 * check_socket_type). */
static bool type_pairs(zmtp_role role, const char *t) {
    switch (role) {
    case ZMTP_REQ: return !strcmp(t, "REP") || !strcmp(t, "ROUTER");
    case ZMTP_REP: return !strcmp(t, "REQ") || !strcmp(t, "DEALER");
    case ZMTP_DEALER: return !strcmp(t, "REP") || !strcmp(t, "DEALER") || !strcmp(t, "ROUTER");
    case ZMTP_ROUTER: return !strcmp(t, "REQ") || !strcmp(t, "DEALER") || !strcmp(t, "ROUTER");
    }
    return false;
}

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int on_ready(zmtp_conn *c, const uint8_t *p, size_t n) {
    if (c->peer_ready) return fail(c, ECT_EPROTO, "the peer sent READY twice");
    bool typed = false;
    while (n > 0) {
        size_t nl = p[0];
        if (nl == 0 || n < 1 + nl + 4) return fail(c, ECT_EPROTO, "malformed READY property");
        const char *name = (const char *)p + 1;
        uint32_t vl = be32(p + 1 + nl);
        if (vl > n - 5 - nl) return fail(c, ECT_EPROTO, "malformed READY property value");
        const uint8_t *v = p + 5 + nl;
        if (nl == 11 && !strncasecmp(name, "Socket-Type", 11)) {
            if (vl == 0 || vl >= TYPE_MAX || memchr(v, 0, vl))
                return fail(c, ECT_EPROTO, "READY: bad Socket-Type (%u bytes)", vl);
            memcpy(c->peer_type, v, vl);
            c->peer_type[vl] = '\0';
            typed = true;
        }
        p += 5 + nl + vl;
        n -= 5 + nl + vl;
    }
    if (!typed) return fail(c, ECT_EPROTO, "READY without Socket-Type");
    if (!type_pairs(c->role, c->peer_type)) {
        char t[TYPE_MAX];
        snprintf(t, sizeof t, "%s", c->peer_type);
        c->peer_type[0] = '\0';
        for (char *s = t; *s; s++)
            if (*s < 0x20 || *s >= 0x7F) *s = '?';
        return fail(c, ECT_EPROTO, "a %s socket cannot talk to our %s", t, role_names[c->role]);
    }
    c->peer_ready = true;
    if (c->held.len) { /* the messages sent while the handshake was going on */
        int rc = out_append(c, c->held.p, c->held.len);
        if (rc) return fail(c, rc, "out of memory");
        free(c->held.p);
        c->held = (zbuf){0};
    }
    return 0;
}

static int on_ping(zmtp_conn *c, const uint8_t *p, size_t n) {
    if (n < 2 || n - 2 > PING_CTX_MAX) return fail(c, ECT_EPROTO, "malformed PING (%zu bytes)", n);
    uint8_t pong[5 + PING_CTX_MAX] = {4, 'P', 'O', 'N', 'G'};
    memcpy(pong + 5, p + 2, n - 2);
    int rc = out_frame(c, F_COMMAND, pong, 5 + n - 2);
    return rc ? fail(c, rc, "out of memory queueing PONG") : 0;
}

static bool cmd_is(const uint8_t *name, size_t nl, const char *want) {
    return nl == strlen(want) && !memcmp(name, want, nl);
}

static int on_command(zmtp_conn *c) {
    const uint8_t *p = c->cmd;
    size_t nl = p[0];
    if (nl == 0 || nl >= c->cmd_n) return fail(c, ECT_EPROTO, "malformed command name");
    const uint8_t *name = p + 1, *body = p + 1 + nl;
    size_t blen = c->cmd_n - 1 - nl;
    if (cmd_is(name, nl, "READY")) return on_ready(c, body, blen);
    if (!c->peer_ready && cmd_is(name, nl, "ERROR")) {
        size_t rl = blen ? body[0] : 0;
        char why[256];
        size_t k = 0;
        for (size_t i = 0; i < rl && 1 + i < blen; i++)
            why[k++] = (body[1 + i] >= 0x20 && body[1 + i] < 0x7F) ? (char)body[1 + i] : '?';
        why[k] = '\0';
        return fail(c, ECT_EPROTO, "the peer refused the handshake: ERROR \"%s\"", why);
    }
    if (!c->peer_ready) return fail(c, ECT_EPROTO, "a command other than READY before READY");
    if (cmd_is(name, nl, "PING")) return on_ping(c, body, blen);
    return 0; /* PONG, and commands of later versions: nothing to do */
}

/* ---- receiving: frames */

/* The frame whose header was just read: checks it and says where its body
 * goes. */
static int message_frame_begin(zmtp_conn *c) {
    bool more = c->flags & F_MORE;
    uint64_t size = c->frame_size;
    if (!c->peer_ready) return fail(c, ECT_EPROTO, "a message before the peer's READY");
    if (!c->in_msg) {
        int rc = zbuf_reserve(&c->q, sizeof(rec_hdr));
        if (rc) return fail(c, rc, "out of memory");
        c->msg_start = c->q.len;
        c->q.len += sizeof(rec_hdr);
        c->in_msg = true;
        c->discard = c->multi = false;
        c->msg_total = c->env_len = c->body_len = 0;
        c->env_frames = 0;
        c->phase = first_phase(c->role);
    }
    if (size > c->max_msg - c->msg_total)
        return fail(c, ECT_ERANGE, "a message of more than %llu bytes (frame of %llu)",
                    (unsigned long long)c->max_msg, (unsigned long long)size);
    c->msg_total += size;
    c->dest = TO_NOWHERE;
    switch (c->phase) {
    case PH_DELIM: /* REQ: a reply starts with the empty delimiter */
        if (size != 0 || !more)
            return fail(c, ECT_EPROTO, "a reply without the empty delimiter frame");
        c->phase = PH_BODY;
        return 0;
    case PH_ENVELOPE: { /* REP: routing frames up to the delimiter */
        if (c->discard) return 0;
        if (!more) { /* no delimiter: libzmq's REP drops such a message, so do we */
            c->discard = true;
            return 0;
        }
        if (size > 0 && ++c->env_frames > ZMTP_MAX_ENVELOPE)
            return fail(c, ECT_EPROTO, "an envelope of more than %d frames", ZMTP_MAX_ENVELOPE);
        uint8_t h[9];
        size_t hl = frame_header(h, F_MORE, size);
        int rc = zbuf_append(&c->q, h, hl);
        if (rc) return fail(c, rc, "out of memory");
        c->env_len += hl + size;
        if (size == 0)
            c->phase = PH_BODY;
        else
            c->dest = TO_QUEUE;
        return 0;
    }
    case PH_OPT_DELIM: /* ROUTER: an empty first frame with more is a REQ's delimiter */
        if (size == 0 && more) {
            static const uint8_t delim[2] = {F_MORE, 0};
            int rc = zbuf_append(&c->q, delim, sizeof delim);
            if (rc) return fail(c, rc, "out of memory");
            c->env_len = sizeof delim;
            c->phase = PH_BODY;
            return 0;
        }
        __attribute__((fallthrough)); /* the first frame is the body */
    case PH_BODY:
        c->body_len = size;
        c->dest = TO_QUEUE;
        c->phase = PH_EXTRA;
        return 0;
    case PH_EXTRA: c->multi = true; return 0;
    }
    return 0;
}

static int frame_begin(zmtp_conn *c) {
    if (c->flags & F_COMMAND) {
        if (!c->frame_size || c->frame_size > ZMTP_CMD_MAX)
            return fail(c, ECT_EPROTO, "a command of %llu bytes (at most %d)",
                        (unsigned long long)c->frame_size, ZMTP_CMD_MAX);
        c->cmd_n = 0;
        c->dest = TO_COMMAND;
        return 0;
    }
    return message_frame_begin(c);
}

static int frame_end(zmtp_conn *c) {
    c->state = RX_FLAGS;
    if (c->flags & F_COMMAND) return on_command(c);
    if (c->flags & F_MORE) return 0;
    c->in_msg = false;
    if (c->discard) {
        c->q.len = c->msg_start;
        return 0;
    }
    rec_hdr h = {c->env_len, c->body_len, c->multi};
    memcpy(c->q.p + c->msg_start, &h, sizeof h);
    c->q_done = c->q.len;
    return 0;
}

static int frame_flags(zmtp_conn *c, uint8_t f) {
    if (f & F_RESERVED) return fail(c, ECT_EPROTO, "frame flags 0x%02x: reserved bits set", f);
    if ((f & F_COMMAND) && (f & F_MORE))
        return fail(c, ECT_EPROTO, "a command frame with the MORE flag");
    c->flags = f;
    c->size_len = (f & F_LONG) ? 8 : 1;
    c->size_n = 0;
    c->state = RX_SIZE;
    return 0;
}

static int frame_size_done(zmtp_conn *c) {
    uint64_t s = 0;
    for (size_t i = 0; i < c->size_len; i++) s = s << 8 | c->size_bytes[i];
    c->frame_size = s;
    c->frame_got = 0;
    int rc = frame_begin(c);
    if (rc) return rc;
    c->state = RX_BODY;
    return s == 0 ? frame_end(c) : 0;
}

static int frame_body(zmtp_conn *c, const uint8_t *d, size_t n) {
    if (c->dest == TO_COMMAND) {
        memcpy(c->cmd + c->cmd_n, d, n);
        c->cmd_n += n;
    } else if (c->dest == TO_QUEUE) {
        int rc = zbuf_append(&c->q, d, n);
        if (rc) return fail(c, rc, "out of memory");
    }
    c->frame_got += n;
    return c->frame_got == c->frame_size ? frame_end(c) : 0;
}

/* Drops the records already handed out (their pointers die with this call). */
static void queue_compact(zmtp_conn *c) {
    if (c->q_head == 0) return;
    memmove(c->q.p, c->q.p + c->q_head, c->q.len - c->q_head);
    c->q.len -= c->q_head;
    c->q_done -= c->q_head;
    if (c->in_msg) c->msg_start -= c->q_head;
    c->q_head = 0;
}

/* ---- the interface */

int zmtp_conn_new(zmtp_role role, uint64_t max_msg, zmtp_conn **out) {
    if (out) *out = NULL;
    if (!out || (unsigned)role > ZMTP_ROUTER || max_msg < 1)
        return ect_set_error(ECT_EINVAL, "zmtp_conn_new: bad role, max_msg or out");
    zmtp_conn *c = calloc(1, sizeof *c);
    if (!c) return ect_set_error(ECT_ENOMEM, "zmtp: out of memory");
    c->role = role;
    c->max_msg = max_msg;
    c->state = RX_GREETING;
    int rc = queue_handshake(c);
    if (rc) {
        zmtp_conn_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void zmtp_conn_free(zmtp_conn *c) {
    if (!c) return;
    free(c->q.p);
    free(c->out.p);
    free(c->held.p);
    free(c);
}

int zmtp_conn_feed(zmtp_conn *c, const uint8_t *data, size_t len) {
    if (!c || (!data && len)) return ect_set_error(ECT_EINVAL, "zmtp_conn_feed: NULL argument");
    if (c->err) return failed_before(c);
    queue_compact(c);
    while (len > 0) {
        int rc = 0;
        size_t n = 1;
        switch (c->state) {
        case RX_GREETING: rc = greeting_byte(c, *data); break;
        case RX_FLAGS: rc = frame_flags(c, *data); break;
        case RX_SIZE:
            n = c->size_len - c->size_n;
            if (n > len) n = len;
            memcpy(c->size_bytes + c->size_n, data, n);
            c->size_n += n;
            if (c->size_n == c->size_len) rc = frame_size_done(c);
            break;
        case RX_BODY:
            n = len;
            if (n > c->frame_size - c->frame_got) n = (size_t)(c->frame_size - c->frame_got);
            rc = frame_body(c, data, n);
            break;
        case RX_DEAD: return failed_before(c);
        }
        if (rc) return rc;
        data += n;
        len -= n;
    }
    return 0;
}

bool zmtp_conn_ready(const zmtp_conn *c) { return c && !c->err && c->peer_ready; }

int zmtp_conn_next(zmtp_conn *c, zmtp_msg *m) {
    if (!c || !m) return ect_set_error(ECT_EINVAL, "zmtp_conn_next: NULL argument");
    memset(m, 0, sizeof *m);
    if (c->err) return failed_before(c);
    if (c->q_head == c->q_done) return 0;
    rec_hdr h;
    memcpy(&h, c->q.p + c->q_head, sizeof h);
    const uint8_t *env = c->q.p + c->q_head + sizeof h;
    m->envelope = h.env_len ? env : NULL;
    m->envelope_len = (size_t)h.env_len;
    m->body = env + h.env_len;
    m->body_len = (size_t)h.body_len;
    m->multi = h.multi != 0;
    c->q_head += sizeof h + (size_t)h.env_len + (size_t)h.body_len;
    return 1;
}

int zmtp_conn_send_req(zmtp_conn *c, const void *body, size_t len) {
    if (!c || (!body && len) || c->role != ZMTP_REQ)
        return ect_set_error(ECT_EINVAL, "zmtp_conn_send_req: NULL argument or not a REQ");
    if (c->err) return failed_before(c);
    static const uint8_t delim[2] = {F_MORE, 0};
    return queue_message(c, delim, sizeof delim, body, len);
}

int zmtp_conn_send_rep(zmtp_conn *c, const uint8_t *envelope, size_t envelope_len, const void *body,
                       size_t len) {
    if (!c || (!envelope && envelope_len) || (!body && len) ||
        (c->role != ZMTP_REP && c->role != ZMTP_ROUTER))
        return ect_set_error(ECT_EINVAL, "zmtp_conn_send_rep: NULL argument or not a REP/ROUTER");
    if (c->err) return failed_before(c);
    return queue_message(c, envelope, envelope_len, body, len);
}

int zmtp_conn_send(zmtp_conn *c, const void *body, size_t len) {
    if (!c || (!body && len) || (c->role != ZMTP_DEALER && c->role != ZMTP_ROUTER))
        return ect_set_error(ECT_EINVAL, "zmtp_conn_send: NULL argument or not a DEALER/ROUTER");
    if (c->err) return failed_before(c);
    return queue_message(c, NULL, 0, body, len);
}

int zmtp_conn_ping(zmtp_conn *c) {
    if (!c) return ect_set_error(ECT_EINVAL, "zmtp_conn_ping: NULL argument");
    if (c->err) return failed_before(c);
    if (!c->peer_ready) return 0; /* commands other than READY wait for the handshake */
    /* libzmq's PING: TTL 0 (ZMQ_HEARTBEAT_TTL unset), no context */
    static const uint8_t ping[7] = {4, 'P', 'I', 'N', 'G', 0, 0};
    return out_frame(c, F_COMMAND, ping, sizeof ping);
}

const uint8_t *zmtp_conn_out(const zmtp_conn *c, size_t *len) {
    if (!c || c->out_head == c->out.len) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = c->out.len - c->out_head;
    return c->out.p + c->out_head;
}

void zmtp_conn_sent(zmtp_conn *c, size_t n) {
    if (!c) return;
    size_t left = c->out.len - c->out_head;
    c->out_head += n < left ? n : left;
    if (c->out_head == c->out.len) c->out.len = c->out_head = 0;
}

const char *zmtp_conn_peer_type(const zmtp_conn *c) {
    return c && c->peer_ready ? c->peer_type : "";
}
