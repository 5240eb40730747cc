/*
 * tcp_frame — encoders, decoders and the target's receive state machine for
 * the tcp transport (see tcp_frame.h). Every frame is little-endian. A write
 * whose region check fails still has its payload consumed (into a scratch
 * buffer), so a refused write costs the connection nothing but the bytes;
 * only a broken frame (wrong magic, type or version) ends the connection,
 * since after one the stream cannot be re-synchronised.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"
#include "xport/tcp_frame.h"

void tcp_encode_hello(uint8_t out[TCP_HELLO_LEN], uint16_t role) {
    memset(out, 0, TCP_HELLO_LEN);
    xp_put_u32(out, TCP_MAGIC_HELLO);
    xp_put_u16(out + 4, TCP_VERSION);
    xp_put_u16(out + 6, role);
}

int tcp_decode_hello(const uint8_t b[TCP_HELLO_LEN], uint16_t role) {
    if (xp_get_u32(b) != TCP_MAGIC_HELLO)
        return ect_set_error(ECT_EPROTO, "tcp hello: bad magic 0x%08x", xp_get_u32(b));
    if (xp_get_u16(b + 4) != TCP_VERSION)
        return ect_set_error(ECT_EPROTO, "tcp hello: version %u, this side speaks %d",
                             xp_get_u16(b + 4), TCP_VERSION);
    if (xp_get_u16(b + 6) != role)
        return ect_set_error(ECT_EPROTO, "tcp hello: role %u, expected %u", xp_get_u16(b + 6),
                             role);
    return 0;
}

void tcp_encode_write(uint8_t out[TCP_HDR_LEN], uint64_t id, uint64_t addr, uint64_t len,
                      uint64_t key) {
    xp_put_u32(out, TCP_MAGIC_WRITE);
    xp_put_u16(out + 4, TCP_TYPE_WRITE);
    xp_put_u16(out + 6, 0);
    xp_put_u64(out + 8, id);
    xp_put_u64(out + 16, addr);
    xp_put_u64(out + 24, len);
    xp_put_u64(out + 32, key);
}

void tcp_encode_ack(uint8_t out[TCP_ACK_LEN], uint64_t id, int32_t status) {
    xp_put_u32(out, TCP_MAGIC_ACK);
    xp_put_u16(out + 4, TCP_TYPE_ACK);
    xp_put_u16(out + 6, 0);
    xp_put_u64(out + 8, id);
    xp_put_u32(out + 16, (uint32_t)status);
    xp_put_u32(out + 20, 0);
}

int tcp_decode_ack(const uint8_t b[TCP_ACK_LEN], uint64_t *id, int32_t *status) {
    if (xp_get_u32(b) != TCP_MAGIC_ACK || xp_get_u16(b + 4) != TCP_TYPE_ACK)
        return ect_set_error(ECT_EPROTO, "tcp ack: bad magic or type");
    *id = xp_get_u64(b + 8);
    *status = (int32_t)xp_get_u32(b + 16);
    return 0;
}

int tcp_rx_init(tcp_rx *rx, xp_regions *regs) {
    memset(rx, 0, offsetof(tcp_rx, out));
    rx->out_len = 0;
    rx->accepted = rx->refused = 0;
    rx->why[0] = '\0';
    rx->regs = regs;
    rx->state = TCP_RX_HELLO;
    rx->discard = malloc(TCP_DISCARD_LEN);
    if (!rx->discard) return ect_set_error(ECT_ENOMEM, "tcp receive scratch");
    return 0;
}

void tcp_rx_fini(tcp_rx *rx) {
    /* Copies still queued write into the region: they end before it is let go. */
    if (rx->dev_pending) rx->dev->drain(rx->dev_ctx);
    rx->dev_pending = false;
    if (rx->ref) xp_region_release(rx->regs, rx->ref);
    rx->ref = NULL;
    free(rx->discard);
    rx->discard = NULL;
}

static int die(tcp_rx *rx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int die(tcp_rx *rx, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rx->why, sizeof rx->why, fmt, ap);
    va_end(ap);
    rx->state = TCP_RX_DEAD;
    return ect_set_error(ECT_EPROTO, "%s", rx->why);
}

/* The device sink failed mid-write: the rest of the payload is discarded and
 * the write answered with rc. */
static void dev_fail(tcp_rx *rx, int rc) {
    ECT_LOGD("xport", "tcp write %" PRIu64 " into device memory failed: %s", rx->id,
             ect_last_error());
    if (rx->status == 0) rx->status = rc;
    rx->slot = NULL;
    rx->slot_fill = 0;
    rx->state = TCP_RX_DISCARD;
}

size_t tcp_rx_want(tcp_rx *rx, void **ptr) {
    if (rx->state == TCP_RX_PAYLOAD && rx->dev_write) {
        if (!rx->slot) {
            uint8_t *p = NULL;
            size_t cap = 0;
            int rc = rx->dev->slot(rx->dev_ctx, rx->ref->device, &p, &cap);
            if (rc || !p || !cap) {
                dev_fail(rx, rc ? rc : ECT_EIO);
                return tcp_rx_want(rx, ptr);
            }
            rx->slot = p;
            rx->slot_cap = cap;
            rx->slot_fill = 0;
        }
        size_t room = rx->slot_cap - rx->slot_fill;
        *ptr = rx->slot + rx->slot_fill;
        return rx->left < room ? (size_t)rx->left : room;
    }
    switch (rx->state) {
    case TCP_RX_HELLO: *ptr = rx->hdr + rx->have; return TCP_HELLO_LEN - rx->have;
    case TCP_RX_HEADER:
        if (rx->out_len + TCP_ACK_LEN > TCP_RX_OUT_CAP) return 0;
        *ptr = rx->hdr + rx->have;
        return TCP_HDR_LEN - rx->have;
    case TCP_RX_PAYLOAD: *ptr = rx->dst; return rx->left > SIZE_MAX ? SIZE_MAX : (size_t)rx->left;
    case TCP_RX_DISCARD:
        *ptr = rx->discard;
        return rx->left > TCP_DISCARD_LEN ? TCP_DISCARD_LEN : (size_t)rx->left;
    default: return 0;
    }
}

/* The current write is fully consumed: queue its ack. */
static void finish_write(tcp_rx *rx) {
    if (rx->dev_pending) { /* acknowledged only once the bytes are on the device */
        int rc = rx->dev->drain(rx->dev_ctx);
        if (rc && rx->status == 0) {
            ECT_LOGD("xport", "tcp write %" PRIu64 ": device copy failed: %s", rx->id,
                     ect_last_error());
            rx->status = rc;
        }
        rx->dev_pending = false;
    }
    rx->dev_write = false;
    rx->slot = NULL;
    if (rx->ref) xp_region_release(rx->regs, rx->ref);
    rx->ref = NULL;
    if (rx->status == 0)
        rx->accepted++;
    else
        rx->refused++;
    tcp_encode_ack(rx->out + rx->out_len, rx->id, rx->status);
    rx->out_len += TCP_ACK_LEN;
    rx->state = TCP_RX_HEADER;
    rx->have = 0;
}

static int on_header(tcp_rx *rx) {
    const uint8_t *h = rx->hdr;
    if (xp_get_u32(h) != TCP_MAGIC_WRITE)
        return die(rx, "tcp frame: bad magic 0x%08x (want 0x%08x)", xp_get_u32(h), TCP_MAGIC_WRITE);
    if (xp_get_u16(h + 4) != TCP_TYPE_WRITE)
        return die(rx, "tcp frame: unknown type %u", xp_get_u16(h + 4));
    rx->id = xp_get_u64(h + 8);
    uint64_t addr = xp_get_u64(h + 16), len = xp_get_u64(h + 24), key = xp_get_u64(h + 32);
    rx->left = len;
    rx->status = xp_region_acquire(rx->regs, key, addr, len, &rx->ref);
    if (rx->status) {
        ECT_LOGD("xport", "tcp write %" PRIu64 " refused: %s", rx->id, ect_last_error());
        rx->state = TCP_RX_DISCARD;
    } else if (rx->ref->kind == ECT_MEM_CUDA && !rx->dev) {
        rx->status = ect_set_error(ECT_ENOTSUP, "this tcp target cannot write device memory");
        xp_region_release(rx->regs, rx->ref);
        rx->ref = NULL;
        rx->state = TCP_RX_DISCARD;
    } else {
        rx->dst = (uint8_t *)(uintptr_t)addr;
        rx->dev_write = rx->ref->kind == ECT_MEM_CUDA;
        rx->state = TCP_RX_PAYLOAD;
    }
    if (rx->left == 0) finish_write(rx);
    return 0;
}

int tcp_rx_advance(tcp_rx *rx, size_t n) {
    switch (rx->state) {
    case TCP_RX_HELLO:
        rx->have += n;
        if (rx->have < TCP_HELLO_LEN) return 0;
        rx->have = 0;
        /* Answer even a bad hello, so the initiator can say why it failed. */
        tcp_encode_hello(rx->out + rx->out_len, TCP_ROLE_TARGET);
        rx->out_len += TCP_HELLO_LEN;
        if (tcp_decode_hello(rx->hdr, TCP_ROLE_INITIATOR) != 0)
            return die(rx, "%s", ect_last_error());
        /* A keyed target never gets here (tcp.c runs its hello and the
         * handshake itself): a peer asking for one is refused, not served
         * in plain. */
        if (tcp_hello_flags(rx->hdr) & TCP_HELLO_AUTH)
            return die(rx, "the peer asks for an authenticated session and this target has no "
                           "data-plane keys (curve_keys)");
        rx->state = TCP_RX_HEADER;
        return 0;
    case TCP_RX_HEADER:
        rx->have += n;
        if (rx->have < TCP_HDR_LEN) return 0;
        return on_header(rx);
    case TCP_RX_PAYLOAD:
        if (rx->dev_write) {
            rx->slot_fill += n;
            rx->left -= n;
            if (rx->slot_fill == rx->slot_cap || rx->left == 0) {
                size_t k = rx->slot_fill;
                int rc = rx->dev->submit(rx->dev_ctx, rx->dst, k);
                rx->dev_pending = true; /* earlier slices may be queued even if this failed */
                rx->dst += k;
                rx->slot = NULL;
                rx->slot_fill = 0;
                if (rc) dev_fail(rx, rc);
            }
            if (rx->left == 0) finish_write(rx);
            return 0;
        }
        rx->dst += n;
        /* fall through */
    case TCP_RX_DISCARD:
        rx->left -= n;
        if (rx->left == 0) finish_write(rx);
        return 0;
    default: return ECT_EPROTO;
    }
}
