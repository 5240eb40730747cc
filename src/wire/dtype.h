/*
 * dtype — torch dtype names and their element sizes, and the check that a
 * tensor's byte count matches its shape. Pure.
 */
#ifndef ECT_WIRE_DTYPE_H
#define ECT_WIRE_DTYPE_H

#include <stddef.h>
#include <stdint.h>

/* Most dimensions a shape may have on the wire. */
#define WIRE_MAX_NDIM 8

/* Canonical name without the "torch." prefix ("bfloat16"), or NULL if unknown. */
const char *wire_dtype_canonical(const char *name);

/* Computes product(shape) * element size into *nbytes with overflow checks.
 * Errors (ect_last_error names `field`): unknown dtype -> ECT_EINVAL
 * "Unsupported torch dtype string", ndim > WIRE_MAX_NDIM -> ECT_EINVAL,
 * overflow -> ECT_EOVERFLOW. */
int wire_shape_nbytes(const char *dtype, const uint64_t *shape, size_t ndim, uint64_t *nbytes,
                      const char *field);

/* wire_shape_nbytes, then requires the result to equal `nbytes`; a mismatch is
 * ECT_EINVAL "shape and dtype do not match nbytes". */
int wire_check_nbytes(const char *dtype, const uint64_t *shape, size_t ndim, uint64_t nbytes,
                      const char *field);

#endif
