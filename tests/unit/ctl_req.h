/*
 * ctl_req — the reserve request the push control tests send: a 2-D tensor of
 * rows x cols elements of a 2-byte dtype. Include after testutil.h and
 * push/control_client.h (which brings the wire types).
 */
#ifndef ECT_TEST_CTL_REQ_H
#define ECT_TEST_CTL_REQ_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static inline wire_ctl_request test_reserve_req(const char *tid, const char *hash, uint64_t rows,
                                                uint64_t cols, const char *dtype) {
    wire_ctl_request q;
    memset(&q, 0, sizeof q);
    q.op = WIRE_OP_RESERVE;
    snprintf(q.u.reserve.transfer_id, sizeof q.u.reserve.transfer_id, "%s", tid);
    snprintf(q.u.reserve.mm_hash, sizeof q.u.reserve.mm_hash, "%s", hash);
    q.u.reserve.tensor.ndim = 2;
    q.u.reserve.tensor.shape[0] = rows;
    q.u.reserve.tensor.shape[1] = cols;
    snprintf(q.u.reserve.tensor.dtype, sizeof q.u.reserve.tensor.dtype, "%s", dtype);
    q.u.reserve.tensor.nbytes = rows * cols * 2;
    return q;
}

#endif
