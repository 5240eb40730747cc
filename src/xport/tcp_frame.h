/*
 * tcp_frame — the tcp transport's wire format (docs/PROTOCOL.md, "tcp") and
 * the target's receive state machine. The machine owns no socket: the
 * connection loop asks where the next bytes go (tcp_rx_want), reads into
 * exactly that place — a header buffer, the destination region itself, or a
 * scratch buffer for refused payload — and reports how many arrived
 * (tcp_rx_advance). Acknowledgements accumulate in rx->out for the loop to
 * send. The fuzz target drives the same two calls with arbitrary bytes.
 *
 * A write into a CUDA region cannot be received in place: its payload goes
 * through the connection's device sink (tcp_rx_dev_ops, given by tcp.c over
 * mem's bounce ring) a slot at a time, each full slot handed on for an
 * asynchronous copy to the device, and the write is acknowledged only after
 * the sink drained (every byte on the device). The machine still owns no
 * I/O: the sink is three calls it makes at fixed points.
 */
#ifndef ECT_TCP_FRAME_H
#define ECT_TCP_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "xport/xport.h"

#define TCP_MAGIC_HELLO 0x58544345u /* "ECTX" */
#define TCP_MAGIC_WRITE 0x57544345u /* "ECTW" */
#define TCP_MAGIC_ACK 0x41544345u   /* "ECTA" */
#define TCP_VERSION 1
#define TCP_ROLE_INITIATOR 1
#define TCP_ROLE_TARGET 2
#define TCP_TYPE_WRITE 1
#define TCP_TYPE_ACK 2
#define TCP_HELLO_LEN 16
/* Hello flags (u32 at offset 8, formerly reserved): bit 0 = this side has
 * data-plane keys and the handshake (xport/auth.h) follows the hellos. */
#define TCP_HELLO_AUTH 1u
#define TCP_HDR_LEN 40
#define TCP_ACK_LEN 24
#define TCP_RX_OUT_CAP (256 * TCP_ACK_LEN)
#define TCP_DISCARD_LEN (64 * 1024)

void tcp_encode_hello(uint8_t out[TCP_HELLO_LEN], uint16_t role);
/* 0 if b is a hello of version 1 from `role`; ECT_EPROTO with detail otherwise. */
int tcp_decode_hello(const uint8_t b[TCP_HELLO_LEN], uint16_t role);
static inline uint32_t tcp_hello_flags(const uint8_t b[TCP_HELLO_LEN]) { return xp_get_u32(b + 8); }
void tcp_encode_write(uint8_t out[TCP_HDR_LEN], uint64_t id, uint64_t addr, uint64_t len,
                      uint64_t key);
void tcp_encode_ack(uint8_t out[TCP_ACK_LEN], uint64_t id, int32_t status);
/* Decodes an ack; ECT_EPROTO if its magic or type is wrong. */
int tcp_decode_ack(const uint8_t b[TCP_ACK_LEN], uint64_t *id, int32_t *status);

enum { TCP_RX_HELLO, TCP_RX_HEADER, TCP_RX_PAYLOAD, TCP_RX_DISCARD, TCP_RX_DEAD };

/* The device sink. Each returns 0 or an ECT_E* code (the write then fails
 * with it and its remaining payload is discarded). */
typedef struct tcp_rx_dev_ops {
    /* A free staging slot for bytes bound to `device`: *ptr, *cap bytes. May
     * wait for the slot's previous copy. */
    int (*slot)(void *ctx, int device, uint8_t **ptr, size_t *cap);
    /* The slot's first n bytes are complete: copy them to device address dst
     * (asynchronously) and move to the next slot. */
    int (*submit)(void *ctx, uint8_t *dst, size_t n);
    /* Waits for every submitted copy; 0 or the first failure. */
    int (*drain)(void *ctx);
} tcp_rx_dev_ops;

typedef struct tcp_rx {
    xp_regions *regs;
    const tcp_rx_dev_ops *dev; /* NULL: CUDA regions are refused (ECT_ENOTSUP) */
    void *dev_ctx;
    bool dev_write;   /* the current write goes through the sink */
    bool dev_pending; /* copies submitted and not yet drained */
    uint8_t *slot;    /* the sink's slot being filled, or NULL */
    size_t slot_cap, slot_fill;
    int state;
    uint8_t hdr[TCP_HDR_LEN];
    size_t have;      /* bytes of hdr filled */
    uint64_t id;      /* current write */
    uint64_t left;    /* payload bytes still to come */
    int32_t status;   /* of the current write */
    uint8_t *dst;     /* next payload byte's place (PAYLOAD) */
    xp_region *ref;   /* region held during PAYLOAD */
    uint8_t *discard; /* TCP_DISCARD_LEN scratch for refused payload */
    uint8_t out[TCP_RX_OUT_CAP];
    size_t out_len;    /* bytes of out waiting to be sent */
    uint64_t accepted; /* writes landed */
    uint64_t refused;  /* writes refused (payload discarded) */
    char why[160];     /* why the connection died (TCP_RX_DEAD) */
} tcp_rx;

int tcp_rx_init(tcp_rx *rx, xp_regions *regs);
/* Releases a region still held mid-payload (after draining the device sink)
 * and the scratch buffer. */
void tcp_rx_fini(tcp_rx *rx);
/* Where the next bytes go and at most how many; 0 when rx->out must be sent
 * first (it is full) or the connection is dead. */
size_t tcp_rx_want(tcp_rx *rx, void **ptr);
/* n (1..want) bytes arrived at *ptr. Returns 0, or ECT_EPROTO once the
 * stream can no longer be framed (the connection must be closed after
 * sending rx->out). */
int tcp_rx_advance(tcp_rx *rx, size_t n);
/* True between frames (nothing half-received). */
static inline int tcp_rx_idle(const tcp_rx *rx) {
    return (rx->state == TCP_RX_HEADER || rx->state == TCP_RX_HELLO) && rx->have == 0;
}

#endif
