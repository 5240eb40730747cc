/*
 * pool — internal side of the public ect_pool (include/ectransfer.h has the
 * contract): constants and accessors that other modules and the tests use.
 */
#ifndef ECT_MEM_POOL_H
#define ECT_MEM_POOL_H

#include <stdint.h>

#include "ectransfer.h"

/* The region's base is aligned to this, and its mapping length is a multiple of it. */
#define POOL_BASE_ALIGN (UINT64_C(2) << 20)

/* Bytes mapped (and the memfd's size): the capacity rounded up to POOL_BASE_ALIGN.
 * A peer maps this many bytes of ect_pool_fd(). No lock. */
uint64_t pool_map_length(const ect_pool *pool);

/* Registers a host pool's region with CUDA (pinned) if it is not yet, so
 * device copies into it run at full speed; the registration is undone at
 * close. 0 when pinned (or a CUDA pool), else the driver's error. Takes the
 * pool's mutex. */
int pool_pin(ect_pool *pool);

#endif
